"""SIGTERM handled like Ctrl-C: what Slurm, Kubernetes and ``kill`` send to stop a run.

During training the loop's handler (``rlcore.trainer.fit._deferred_interrupt``) turns either
signal into "finish the step, save it, stop"; outside the loop :func:`sigterm_as_interrupt`
makes SIGTERM raise :class:`Terminated` (a ``KeyboardInterrupt``), so the same clean-up runs
(Ray and its workers stopped) instead of Ray's driver handler calling ``sys.exit(15)``. The
exit code is ``128 + signal``: 130 for Ctrl-C, 143 for SIGTERM (:func:`exit_code`).

Slurm (``scancel``, the time limit) and Kubernetes send SIGTERM to the whole process group,
Ray's GCS, raylet and workers included, which would die mid-step and leave nothing to save.
:func:`children_shielded_from_sigterm` gives every process the driver starts a blocked SIGTERM
(the mask survives ``fork`` and ``exec``), as Ray itself blocks SIGINT in its processes so a
terminal's Ctrl-C reaches only the driver. The driver then stops them (``ray.shutdown`` and the
reward pool's kill fall back to SIGKILL).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = [
    "STOP_SIGNALS",
    "Terminated",
    "children_shielded_from_sigterm",
    "exit_code",
    "note_signal",
    "sigterm_as_interrupt",
]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled exactly like Ctrl-C."""


def note_signal(signum: int) -> None:
    """Record a stop signal; :func:`exit_code` reports the last one."""
    _received.append(int(signum))


def exit_code(default: int = 128 + signal.SIGINT) -> int:
    """``128 + the last stop signal`` (143 for SIGTERM), ``default`` when none was noted."""
    return 128 + _received[-1] if _received else default


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        note_signal(signum)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def children_shielded_from_sigterm() -> Iterator[None]:
    """While inside, processes started from this thread (and threads it starts) have SIGTERM
    blocked for good; this process still receives it, through a thread started first.

    A process-directed signal goes to any thread that does not block it; Python then runs the
    handler in the main thread, as always. The receiving thread only waits.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    receiver = threading.Thread(
        target=threading.Event().wait, name="rlcore-sigterm-receiver", daemon=True
    )
    receiver.start()  # before the block: it keeps the mask this thread has now
    # multiprocessing starts its resource tracker on first use (the reward pool's forkserver)
    # and then *unblocks* SIGINT and SIGTERM in the calling thread; started now, it never runs
    # that code again, so the block below holds for the forkserver and the pool's workers.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        # multiprocessing's exit hook stops daemon children with SIGTERM and then joins them
        # without a bound: one left running (the reward pool closes its own) would hang the
        # exit, since it blocks SIGTERM. Nothing started in here is needed once it is left.
        import multiprocessing

        for child in multiprocessing.active_children():
            if child.daemon:
                child.kill()
                child.join(timeout=5)


def exit_origin(exc: BaseException) -> str:
    """Where ``exc`` was raised: ``func (file:line)`` of the innermost frame that is not a
    stand-in for ``sys.exit`` (wandb, for one, replaces ``sys.exit`` for the whole process
    once its service starts, so the raising frame would otherwise always be wandb's)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    stand_in = getattr(getattr(sys.exit, "__func__", sys.exit), "__code__", None)
    while len(frames) > 1 and frames[-1][0] is stand_in:
        frames.pop()
    if not frames:
        return "an unknown place"
    code, line = frames[-1]
    return f"{code.co_name} ({code.co_filename}:{line})"
