"""Calling one reward on one response, with a time limit, in the driver or a pool worker.

A task is a plain tuple (cheap to pickle to pool workers)::

    (task_id, reward_name, data_source, solution_str, ground_truth, extra_info)

and its outcome another::

    (status, score, extras, message, seconds)   # status: "ok" | "timeout" | "error"

The time limit is ``SIGALRM`` (``setitimer``), so it works only on a process's main thread;
it interrupts pure-Python code and Python's ``re`` (which checks for signals while it
backtracks). Code that blocks signals or loops in C is cut off by the pool's watchdog instead,
which kills the worker. The alarm never raises inside an ``import``: a module cut off half-way
stays half-initialised in ``sys.modules`` for the rest of the process (sympy left that way
breaks every later math check), so a tick there is deferred by ``_RETRY_S`` until the import
has finished.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from rlcore.interfaces import BaseReward

__all__ = [
    "Outcome",
    "ScoreTimeout",
    "Task",
    "alarm_available",
    "alarm_handler",
    "call_reward",
    "normalize_result",
]

Task = tuple[int, str, str, str, Any, "dict[str, Any] | None"]
Status = Literal["ok", "timeout", "error"]
Outcome = tuple[Status, float, dict[str, Any], str, float]


class ScoreTimeout(BaseException):
    """Raised into a scorer by the alarm. A BaseException, so a scorer's own
    ``except Exception`` (math-verify has several) cannot swallow it."""


# The handler raises only while a call is armed, so an alarm that lands after the scorer
# returned (between its return and the timer being cleared) cannot escape.
_armed = False
# A tick that lands inside an import is retried this much later.
_RETRY_S = 0.05


def _in_import(frame: Any) -> bool:
    """Whether the interrupted frame runs inside the import machinery (up to call_reward)."""
    while frame is not None:
        code = frame.f_code
        if code is call_reward.__code__:
            return False
        if code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


def _on_alarm(signum: int, frame: Any) -> None:
    global _armed
    if _armed:
        if _in_import(frame):
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        _armed = False
        raise ScoreTimeout


def alarm_available() -> bool:
    """Whether ``SIGALRM`` time limits work here (a POSIX main thread)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def alarm_handler() -> Iterator[None]:
    """Install the timeout handler for a batch of calls; restore the previous one after."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    # An outer timer (pytest-timeout's, a caller's) is paused while we score, then resumed.
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay > 0:
            left = max(1e-3, outer_delay - (time.monotonic() - start))
            signal.setitimer(signal.ITIMER_REAL, left, outer_interval)


def normalize_result(result: Any) -> tuple[float, dict[str, Any]]:
    """A reward's return value as ``(score, extras)``; a malformed one raises ``TypeError``."""
    extras: dict[str, Any] = {}
    if isinstance(result, Mapping):
        if "score" not in result:
            msg = f"reward returned a dict without 'score' (keys: {sorted(result)})"
            raise TypeError(msg)
        value = result["score"]
        extras = {str(k): v for k, v in result.items() if k != "score"}
    else:
        value = result
    numeric = isinstance(value, int | float) or hasattr(value, "__float__")  # numpy scalars
    if isinstance(value, str) or not numeric:
        msg = f"reward score must be a number, got {type(value).__name__}"
        raise TypeError(msg)
    score = float(value)
    if not math.isfinite(score):
        msg = f"reward score must be finite, got {score}"
        raise ValueError(msg)
    return score, extras


def call_reward(rewards: Mapping[str, BaseReward], task: Task, timeout_s: float | None) -> Outcome:
    """Score one task. Never raises (except ``KeyboardInterrupt``/``SystemExit``).

    ``timeout_s`` arms ``SIGALRM``; the caller must be inside :func:`alarm_handler` on the
    main thread. ``None`` runs without a limit.
    """
    global _armed
    _, name, data_source, solution, ground_truth, extra_info = task
    start = time.perf_counter()
    try:
        try:
            if timeout_s is not None:
                _armed = True
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
            result = rewards[name].score(data_source, solution, ground_truth, extra_info)
        finally:
            _armed = False
            if timeout_s is not None:
                signal.setitimer(signal.ITIMER_REAL, 0.0)
        score, extras = normalize_result(result)
    except ScoreTimeout:
        elapsed = time.perf_counter() - start
        return "timeout", 0.0, {}, f"reward {name!r} ran past {timeout_s} s", elapsed
    except Exception as err:  # a scorer's bug must not end the run: score 0, counted
        elapsed = time.perf_counter() - start
        return "error", 0.0, {}, f"reward {name!r}: {type(err).__name__}: {err}", elapsed
    return "ok", score, extras, "", time.perf_counter() - start
