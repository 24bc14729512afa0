"""Read back what an offline wandb run recorded, without a server: its history rows.

An offline run's ``run-<id>.wandb`` file is a LevelDB-style log (a 7-byte ``:W&B`` header,
then 32 KiB blocks of records, each a CRC, a length, a type: full, first, middle or last
piece) of protobuf ``Record`` messages; the ``history`` ones hold each ``log`` call. The
wandb client no longer ships a Python reader (its core is in Go), so this is the check that
what rlcore logged is what an upload (``wandb sync``) would send.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HEADER = 7
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[tuple[int, bytes]]:
    pos = _HEADER
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            continue
        yield kind, data[pos : pos + length]
        pos += length


def records(path: str | Path) -> Iterator[Any]:
    """Every protobuf ``Record`` in a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        msg = f"{path} is not a wandb run file (no :W&B header)"
        raise ValueError(msg)
    pending = b""
    for kind, chunk in _chunks(data):
        if kind in (_FIRST, _MIDDLE):
            pending = (b"" if kind == _FIRST else pending) + chunk
            continue
        payload = pending + chunk if kind == _LAST else chunk
        pending = b""
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def history(path: str | Path) -> list[dict[str, Any]]:
    """The rows ``log`` wrote (``_step`` included), as dicts of JSON values."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            rows.append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}
            )
    return rows


def config(path: str | Path) -> dict[str, Any]:
    """The run's config (the last value of each key), as plain JSON values."""
    found: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") in ("config", "run"):
            updates = (
                record.config.update if record.HasField("config") else record.run.config.update
            )
            for item in updates:
                found[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return found


def wait_closed(path: str | Path, timeout_s: float = 60.0) -> Path:
    """``path`` once wandb's writer (a separate process) has written the run's ``exit``
    record: ``run.finish()`` can return before the last records reach the disk."""
    deadline = time.monotonic() + timeout_s
    while not any(r.WhichOneof("record_type") == "exit" for r in records(path)):
        if time.monotonic() > deadline:
            msg = f"{path} got no exit record within {timeout_s} s"
            raise TimeoutError(msg)
        time.sleep(0.2)
    return Path(path)


def run_files(run_dir: str | Path, run_id: str) -> list[Path]:
    """Every offline ``.wandb`` file of run ``run_id`` under an rlcore run directory, oldest
    first: one per start of the run (a resumed run adds one; wandb names a second folder of
    the same second ``offline-run-<time>-<id>-1``)."""
    found = Path(run_dir).glob(f"wandb/offline-run-*-{run_id}*/run-{run_id}.wandb")
    return sorted(found, key=lambda p: p.stat().st_mtime_ns)
