"""Read back what W&B wrote in offline mode: the history rows of ``run-<id>.wandb`` files.

wandb 0.31 ships no Python reader of its offline files (its ``datastore`` module is gone;
``wandb-core`` reads them), but the format is small: the LevelDB log format (32 KiB blocks of
chunks, each a 7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte W&B
header, each record one ``wandb.proto.wandb_internal_pb2.Record``. The records are decoded
with wandb's own protobuf classes. A torn last chunk (an attempt killed while writing) ends
the read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    """The complete records of one ``.wandb`` file, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B offline file: {data[:7]!r}"
    out: list[bytes] = []
    pos, pending = _CHUNK_HEADER, b""
    while pos + _CHUNK_HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        if len(chunk) < length:
            break
        pos += _CHUNK_HEADER + length
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            out.append(pending + chunk)
            pending = b""
    return out


def decoded(path: Path) -> list[Any]:
    """Every complete record of one ``.wandb`` file, as wandb's own ``Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for raw in records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """Every ``run.log`` row in the file: its values by key (``_step`` included)."""
    return [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
         for item in record.history.item}
        for record in decoded(path)
        if record.WhichOneof("record_type") == "history"
    ]  # fmt: skip


def logged(run_folders: list[Path], step_key: str, key: str) -> list[tuple[Any, Any]]:
    """``(row[step_key], row[key])`` for every row holding ``key`` in the ``.wandb`` files of
    ``run_folders`` (offline run folders), in folder order."""
    out = []
    for folder in run_folders:
        for path in sorted(folder.glob("run-*.wandb")):
            out.extend((row.get(step_key), row[key]) for row in history(path) if key in row)
    return out


def closed(folder: Path) -> bool:
    """The offline run in ``folder`` holds its ``exit`` record, W&B's last: under a CPU hog
    ``wandb.finish()`` was seen to return before wandb-core had written the file, so a test
    waits for this before reading it back. A killed attempt's file never gets one."""
    return any(
        record.WhichOneof("record_type") == "exit"
        for path in folder.glob("run-*.wandb")
        for record in decoded(path)
    )
