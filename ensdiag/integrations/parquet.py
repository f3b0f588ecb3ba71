"""Rows (export.py) as a Parquet file (`pip install 'ensdiag[parquet]'`), written atomically.

    diagnosis.save_examples("examples.parquet")
    ensdiag report runs/demo --examples examples.parquet
"""

from pathlib import Path

import pyarrow
import pyarrow.parquet

from ..io import atomic_write_bytes


def write_parquet(rows: list[dict], path, columns: list[str]) -> Path:
    table = pyarrow.Table.from_pylist([{key: row.get(key) for key in columns} for row in rows]) if rows \
        else pyarrow.table({key: [] for key in columns})
    buffer = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, buffer)
    return atomic_write_bytes(path, buffer.getvalue().to_pybytes())
