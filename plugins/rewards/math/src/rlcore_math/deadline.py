"""Run a function under a wall-clock limit, from the main thread or any other thread.

math-verify's own timeouts use ``signal.alarm`` (whole seconds, main thread only, and they
raise in a thread). We call it with its timeouts off and impose ours:

- main thread (a plain process, a process-pool worker, a Ray task): ``signal.setitimer``
  with a handler that raises :class:`_DeadlineHit`, a ``BaseException`` so that sympy's
  ``except Exception`` blocks cannot swallow it. The timer keeps firing every 50 ms until
  the call has unwound, and never raises inside a finalizer: a raise there is swallowed
  by Python, and with a one-shot alarm a GC pass at the wrong moment let a 1 s limit run
  for the whole computation (45 s). A timer the caller had armed (pytest-timeout) is
  re-armed afterwards with its remaining time. Nor does it raise inside an ``import``: a
  module cut off half-way stays in ``sys.modules`` half-initialised (sympy left that way made
  every later math-verify check say "different"), so a tick during an import is deferred to
  the next one, after the import has finished.
- other threads: the work runs in a daemon thread that we stop waiting for. Python cannot
  kill a thread, so a runaway computation keeps a core busy until it ends; the input guards
  in :mod:`rlcore_math.verify` keep such work short.

Neither can interrupt one long C call (a huge ``int`` power holds the GIL), which is why
:mod:`rlcore_math.verify` refuses such expressions before sympy sees them. The cyclic garbage
collector is such a call too: a full collection of a big process's heap (a trainer's, a test
session's) took 1-2 s under load, so on the main thread automatic collection is off for the
limited call and back on after it (sympy's objects are freed by reference counting; the
collection it owes runs later, outside the limit). A full pass that landed inside the call was
what pushed a 1 s limit to 2.6 s in a full test run.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

__all__ = ["DeadlineExceeded", "call_with_deadline", "in_import_or_finalizer"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# After the first tick, the alarm fires again this often until the call has unwound.
_RETRY_S = 0.05
_FINALIZER_FILES = ("weakref.py", "_weakrefset.py")
# Frames of the import machinery (``<frozen importlib._bootstrap>``, ``..._external>``).
_IMPORT_FILES = ("<frozen importlib.",)


def in_import_or_finalizer(frame: FrameType | None, stop: object = None) -> bool:
    """Whether ``frame`` (a signal handler's) runs inside an import or a finalizer.

    Walks outwards until ``stop`` (a code object) or the bottom of the stack. Raising there
    would leave a half-initialised module in ``sys.modules`` (import) or be swallowed by
    Python (``__del__``, weakref callbacks, and ``sys.unraisablehook`` itself: the hook that
    reports a swallowed raise; pytest's formats the traceback there, and a raise inside it
    failed the test that had hit the deadline with "Failed to process unraisable exception").
    """
    hook = _unraisable_hook_code()
    while frame is not None:
        code = frame.f_code
        if code is stop:
            return False
        name = code.co_filename
        if code.co_name == "__del__" or name.endswith(_FINALIZER_FILES) or code is hook:
            return True
        if name.startswith(_IMPORT_FILES):
            return True
        frame = frame.f_back
    return False


def _unraisable_hook_code() -> object:
    """The code object of ``sys.unraisablehook`` when it is Python code (pytest's is a
    ``functools.partial`` of a function); None for the interpreter's built-in hook."""
    hook = sys.unraisablehook
    hook = getattr(hook, "func", hook)
    return getattr(hook, "__code__", None)


def _inside(frame: FrameType | None, code: object) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


class DeadlineExceeded(TimeoutError):
    """The function did not finish within its time limit."""


class _DeadlineHit(BaseException):
    """Raised by the SIGALRM handler; a BaseException so library code does not catch it."""


def call_with_deadline(fn: Callable[[], T], timeout_s: float | None) -> T:
    """``fn()``, or :class:`DeadlineExceeded` after ``timeout_s`` seconds (None: no limit)."""
    if timeout_s is None or timeout_s <= 0:
        return fn()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _call_with_alarm(fn, timeout_s)
    return _call_in_thread(fn, timeout_s)


def _call_with_alarm(fn: Callable[[], T], timeout_s: float) -> T:
    def limited() -> T:  # its frame on the stack marks "inside the limited call"
        return fn()

    limited_code = limited.__code__

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        # Raise only inside ``limited``: a tick that lands after it returned (while we
        # disarm) is ignored instead of escaping into the caller. Not inside an import or a
        # finalizer either (see the module docstring): the next tick, _RETRY_S later, tries
        # again.
        if _inside(frame, limited_code) and not in_import_or_finalizer(frame, limited_code):
            raise _DeadlineHit

    start = time.monotonic()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection is one C call no tick can cut (module docstring)
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    # The timer repeats every _RETRY_S after the first tick, see on_alarm.
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s, _RETRY_S)
    try:
        return limited()
    except _DeadlineHit:
        msg = f"gave up after {timeout_s:g} s"
        raise DeadlineExceeded(msg) from None
    finally:
        # signal.signal() runs any pending handler (ours, a no-op here) before swapping.
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if gc_was_enabled:
            gc.enable()
        if old_delay > 0:
            # Give the caller's own alarm (pytest-timeout) what is left of it, at least a tick.
            remaining = max(old_delay - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, remaining, old_interval)


def _call_in_thread(fn: Callable[[], T], timeout_s: float) -> T:
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the caller below
            box["error"] = err

    worker = threading.Thread(target=target, name="rlcore-math-verify", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        log.warning("math answer check still running after %.3g s; abandoned it", timeout_s)
        msg = f"gave up after {timeout_s:g} s"
        raise DeadlineExceeded(msg)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
