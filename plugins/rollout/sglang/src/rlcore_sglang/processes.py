"""SGLang's processes and event loop seen from the rollout worker: the SIGTERM handler a request
adds to the loop, and the child process trees stopped at close."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading

from rlcore.errors import RlcoreError

log = logging.getLogger(__name__)


# Bound of one wait on SGLang's loop thread or its processes (start, stop, shutdown).
LOOP_WAIT_S = 60.0


class keep_sigterm:
    """Keep this process's SIGTERM handler across an Engine call on ``loop``.

    SGLang's first request adds its own SIGTERM handler to the loop it binds, when in the main
    thread (``loop.add_signal_handler(signal.SIGTERM, ...)``,
    managers/tokenizer_manager.py:2453-2455); rlcore's worker handles SIGTERM itself
    (rlcore.workers.termination). Afterwards the loop's handler is removed and the previous one
    put back. Requests from :meth:`SGLangRollout._serve_loop`'s thread never add one.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.main = threading.current_thread() is threading.main_thread()
        self.before = signal.getsignal(signal.SIGTERM) if self.main else None

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if not self.main or self.before is None:  # None: a handler set outside Python
            return
        if signal.getsignal(signal.SIGTERM) is self.before:
            return
        # No loop handler to remove (another loop installed it): put ours back all the same.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            self.loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self.before)  # type: ignore[arg-type]


def child_pids() -> set[int]:
    """Pids of this process's direct children (psutil comes with SGLang)."""
    try:
        import psutil
    except ImportError:
        return set()
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=False)}


def stop_trees(pids: set[int], *, timeout_s: float) -> None:
    """SIGTERM ``pids`` and their descendants, SIGKILL what is left after ``timeout_s``."""
    import psutil

    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs.extend([*proc.children(recursive=True), proc])
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    _, alive = psutil.wait_procs(alive, timeout=timeout_s)
    if alive:
        msg = f"SGLang processes {[p.pid for p in alive]} still alive after SIGKILL"
        raise RlcoreError(msg)
