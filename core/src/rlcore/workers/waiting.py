"""Bounded waits for the single controller: every wait on Ray has a deadline and a name.

The bounds are config keys (``[resources]``, defaults in :mod:`rlcore.config.schema`), handed
to the worker group and the pool as constructor arguments:

=============================== ==== ==========================================================
``resources.call_timeout_s``     3600 one group call: every rank's result (or the first error)
``resources.start_timeout_s``    600  a group's actors placed in their bundles, ``__init__`` done
``resources.placement_timeout_s`` 120 a pool's placement groups reserved by Ray
=============================== ==== ==========================================================

The call default is long because one call may be a whole generate or training pass; lower it
for tests and for runs whose calls are known to be short. Collectives inside the workers have
their own bound, ``resources.collective_timeout_s`` (see :mod:`rlcore.workers.worker`).

:func:`wait_in_completion_order` is the one loop that waits on a call's ObjectRefs: it yields
each ref's index as it finishes, wakes every ``poll_s`` seconds to run an optional ``on_tick``
hook (the place for a liveness check of the pending ranks) and, once the deadline passes, raises
the error that ``on_timeout`` builds from the indices still pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rlcore.config.schema import check_seconds
from rlcore.errors import ConfigError

__all__ = [
    "CALL_TIMEOUT_KEY",
    "PLACEMENT_TIMEOUT_KEY",
    "START_TIMEOUT_KEY",
    "seconds_setting",
    "wait_in_completion_order",
]

# The config keys that set each bound, named in the errors a timeout raises.
CALL_TIMEOUT_KEY = "resources.call_timeout_s"
START_TIMEOUT_KEY = "resources.start_timeout_s"
PLACEMENT_TIMEOUT_KEY = "resources.placement_timeout_s"

# How often a pending wait wakes up to run its on_tick hook.
DEFAULT_POLL_S = 5.0


def seconds_setting(name: str, value: float) -> float:
    """A timeout given to a constructor (``call_timeout_s=...``), checked by the config's own
    rule (:func:`rlcore.interfaces.seconds`); a bad one is one ``ConfigError`` line."""
    try:
        return check_seconds(name, value)
    except ValueError as err:
        raise ConfigError(str(err)) from None


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
