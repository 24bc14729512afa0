"""One ``rlcore train`` per run directory: an advisory lock on ``<run_dir>/.rlcore.lock``.

Two runs on one directory would interleave ``metrics.jsonl`` and overwrite each other's
checkpoints, both "succeeding". The lock is an ``flock`` held for the life of the command: the
kernel drops it when the process ends however it ends, so a killed run never leaves a stale
lock. The file records the holder's pid and start time for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import IO

from rlcore.errors import ConfigError

__all__ = ["LOCK_FILE", "RunLock", "acquire_run_lock"]

LOCK_FILE = ".rlcore.lock"


class RunLock:
    """A held run-directory lock; :meth:`release` (or process exit) frees it."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle: IO[str] | None = handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["time"])))
        return f"pid {int(info['pid'])}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown"


def acquire_run_lock(run_dir: str | os.PathLike[str]) -> RunLock:
    """Lock ``run_dir`` (created if needed) for this process, or fail with one line."""
    folder = Path(run_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_FILE
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release()
    except OSError as err:
        msg = f"trainer.run_dir: cannot write to {folder} ({err.strerror or err}); choose another"
        raise ConfigError(msg) from err
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        msg = (
            f"trainer.run_dir: {folder} is in use by another rlcore train ({_holder(path)}); "
            "wait for it to finish or set another trainer.run_dir"
        )
        raise ConfigError(msg) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": os.getpid(), "time": time.time()}) + "\n")
    handle.flush()
    return RunLock(path, handle)
