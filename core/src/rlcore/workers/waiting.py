"""Bounded waits for the single controller: every wait on Ray has a deadline and a name.

Settings (environment variables, read when a group or pool is built; a constructor argument
wins over the variable):

============================== ==== ===========================================================
``RLCORE_CALL_TIMEOUT_S``      3600 one group call: every rank's result (or the first error)
``RLCORE_START_TIMEOUT_S``     600  a group's actors placed in their bundles, ``__init__`` done
``RLCORE_PLACEMENT_TIMEOUT_S`` 120  a pool's placement groups reserved by Ray
============================== ==== ===========================================================

The call default is long because one call may be a whole generate or training pass; lower it
for tests and for runs whose calls are known to be short. Collectives inside the workers have
their own bound, ``RLCORE_COLLECTIVE_TIMEOUT_S`` (see :mod:`rlcore.workers.worker`).

:func:`wait_in_completion_order` is the one loop that waits on a call's ObjectRefs: it yields
each ref's index as it finishes, wakes every ``poll_s`` seconds to run an optional ``on_tick``
hook (the place for a liveness check of the pending ranks) and, once the deadline passes, raises
the error that ``on_timeout`` builds from the indices still pending.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rlcore.errors import ConfigError

__all__ = [
    "CALL_TIMEOUT_ENV",
    "PLACEMENT_TIMEOUT_ENV",
    "START_TIMEOUT_ENV",
    "call_timeout_s",
    "placement_timeout_s",
    "start_timeout_s",
    "timeout_setting",
    "wait_in_completion_order",
]

CALL_TIMEOUT_ENV = "RLCORE_CALL_TIMEOUT_S"
START_TIMEOUT_ENV = "RLCORE_START_TIMEOUT_S"
PLACEMENT_TIMEOUT_ENV = "RLCORE_PLACEMENT_TIMEOUT_S"
DEFAULT_CALL_TIMEOUT_S = 3600.0
DEFAULT_START_TIMEOUT_S = 600.0
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0

# How often a pending wait wakes up to run its on_tick hook.
DEFAULT_POLL_S = 5.0


def timeout_setting(
    name: str,
    default: float,
    given: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    """``given`` if not None, else the positive number in environment variable ``name``, else
    ``default``; a non-positive or non-numeric value raises ``ConfigError`` naming it."""
    if given is not None:
        if not given > 0:
            msg = f"{name.lower().removeprefix('rlcore_')}={given!r}: expected a positive number"
            raise ConfigError(msg)
        return float(given)
    env = os.environ if environ is None else environ
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        msg = f"{name}={raw!r}: expected a positive number of seconds"
        raise ConfigError(msg)
    return value


def call_timeout_s(given: float | None = None) -> float:
    return timeout_setting(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_S, given)


def start_timeout_s(given: float | None = None) -> float:
    return timeout_setting(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT_S, given)


def placement_timeout_s(given: float | None = None) -> float:
    return timeout_setting(PLACEMENT_TIMEOUT_ENV, DEFAULT_PLACEMENT_TIMEOUT_S, given)


def wait_in_completion_order(
    refs: Sequence[Any],
    *,
    timeout_s: float,
    on_timeout: Callable[[list[int], float], BaseException],
    on_tick: Callable[[list[int], float], None] | None = None,
    poll_s: float = DEFAULT_POLL_S,
) -> Iterator[int]:
    """Yield the index of each of ``refs`` as it finishes (first finished, first yielded).

    ``on_tick(pending_indices, waited_s)`` runs whenever nothing finished for ``poll_s``
    seconds; it may raise to end the wait early. After ``timeout_s`` seconds the error
    ``on_timeout(pending_indices, waited_s)`` is raised. Duplicate refs are yielded once (the
    first index). Errors of ``ray.wait`` itself propagate.
    """
    import ray

    index: dict[Any, int] = {}
    for i, ref in enumerate(refs):
        index.setdefault(ref, i)
    pending = list(index)
    start = time.monotonic()
    deadline = start + timeout_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise on_timeout(sorted(index[r] for r in pending), time.monotonic() - start)
        ready, pending = ray.wait(pending, num_returns=1, timeout=min(left, poll_s))
        if not ready:
            if on_tick is not None and time.monotonic() < deadline:
                on_tick(sorted(index[r] for r in pending), time.monotonic() - start)
            continue
        for ref in ready:
            yield index[ref]
