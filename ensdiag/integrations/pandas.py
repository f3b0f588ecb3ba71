"""Rows (export.py) as a pandas DataFrame (`pip install 'ensdiag[pandas]'`).

    diagnosis.to_frame()                      # one row per number
    ensdiag.report.report_frame("runs/demo")  # a report's long rows
"""

import pandas


def data_frame(rows: list[dict], columns: list[str]) -> pandas.DataFrame:
    return pandas.DataFrame([{key: row.get(key) for key in columns} for row in rows], columns=columns)
