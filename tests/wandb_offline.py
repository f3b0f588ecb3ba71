"""Reading an offline W&B run back from its folder (tests only): the run-<id>.wandb file is a
LevelDB-style log (a 7-byte header ":W&B", magic, version; then 32 KiB blocks of records, each
a CRC-32, a length, a type FULL/FIRST/MIDDLE/LAST and its bytes) of W&B's own protobuf
`Record`s, which wandb.proto parses. The wandb package ships no reader for it any more."""

import json
import struct
import zlib
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes):
    if data[:4] != b":W&B":
        raise ValueError("not a W&B run file")
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        room = BLOCK - position % BLOCK
        if room < HEADER:  # a block's tail too short for a record header is padding
            position += room
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind == 0:
            continue
        if zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != checksum:
            raise ValueError(f"bad checksum at byte {position}")
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk


def read_offline_run(folder) -> dict:
    """{"history": [{key: value}], "summary": {key: value}, "media": [paths]} of an offline run folder."""
    from wandb.proto import wandb_internal_pb2
    folder = Path(folder)
    history, summary = [], {}
    for payload in _payloads(next(folder.glob("run-*.wandb")).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "summary":
            summary.update({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                            for item in record.summary.update})
    return {"history": history, "summary": summary, "media": sorted((folder / "files" / "media").rglob("*.png"))}
