"""Whether a failed save failed because the disk is full.

A full disk shows up in many shapes: ``OSError(ENOSPC)`` from the driver's own writes, the
same error raised in a worker and delivered by Ray (:attr:`rlcore.errors.WorkerError.
remote_cause`, or Ray's ``RayTaskError.cause``), torch's ``RuntimeError: [enforce fail at
inline_container.cc] . PytorchStreamWriter failed writing file ...: file write failed`` (no
errno), or ``torch.distributed.checkpoint``'s ``CheckpointException`` that carries each rank's
failure as text. :func:`disk_full` looks through the exception chain for ENOSPC or its message
and, failing that, at the folder's free space at the moment of the failure (before the
partial save is removed).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["FULL_BELOW_BYTES", "disk_full"]

# Free space under which a failed write is taken for a full disk (a save whose error names no
# errno, e.g. torch's "file write failed").
FULL_BELOW_BYTES = 1 << 20

_MESSAGE = os.strerror(errno.ENOSPC)  # "No space left on device"


def _chain(err: BaseException) -> list[BaseException]:
    seen: set[int] = set()
    out: list[BaseException] = []
    stack: list[object] = [err]
    while stack:
        item = stack.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        out.append(item)
        stack.extend(
            (
                item.__cause__,
                item.__context__,
                getattr(item, "cause", None),  # Ray's RayTaskError
                getattr(item, "remote_cause", None),  # rlcore's WorkerError
            )
        )
    return out


def disk_full(err: BaseException, folder: Path) -> bool:
    """Whether ``err`` (raised while writing into ``folder``) means the disk is full."""
    for item in _chain(err):
        if isinstance(item, OSError) and item.errno == errno.ENOSPC:
            return True
        try:
            text = str(item)
        except Exception:  # a broken __str__ says nothing about the disk
            continue
        if _MESSAGE in text:
            return True
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < FULL_BELOW_BYTES
