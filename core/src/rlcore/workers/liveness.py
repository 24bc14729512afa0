"""Liveness of worker processes: a heartbeat, so a stopped or wedged worker ends the run.

Ray notices a worker that *died*; one that is stopped (``kill -STOP``, a debugger, a frozen
NFS mount) or wedged holding the GIL keeps its connections open and the driver would wait
forever. Each worker runs a daemon thread (:func:`start_heartbeat`) that bumps a counter in
Ray's GCS key-value store every :data:`BEAT_S` seconds; the thread keeps beating while the
worker computes (torch and gloo release the GIL), and stops when the process is stopped.

While the driver waits for a call (``RayWorkerGroup._gather``), it looks at the counters of
the ranks still running whenever nothing finished for :data:`POLL_S` seconds (the group's
wait poll for its calls; :func:`check_ranks`: one key-value read per pending rank). A counter
that has not moved for ``resources.heartbeat_timeout_s`` seconds (default 30, the group's
``heartbeat_timeout_s``; by the driver's clock, so clocks of other nodes do not matter) ends the
run with one line::

    role actor rank 1 (node 127.0.0.1, pid 4242) stopped responding in update_actor: no
    heartbeat for 31 s (resources.heartbeat_timeout_s = 30); the process is stopped or wedged

The bound, from the moment a worker stops: its last beat was at most :data:`BEAT_S` earlier;
the driver sees that last value change at its next poll, at most ``BEAT_S + POLL_S`` after the
beat, and reports once the value has been still for more than the timeout, at the first poll
after that. So the error comes at most ``timeout + BEAT_S + 2 * POLL_S`` seconds after the stop
(32 s + a poll's own time with the defaults, 30 + 1 + 2 x 0.5); ``rlcore train`` then stops the
workers and Ray and prints the line as it exits. ``tests/test_liveness.py`` times both: with the
default timeout the run ended 30 s after the stop and the driver exited 17 s later, on a 2-core
machine at load average ~75. Issue 31 measured 43 s to the exit with the 5 s poll of then
(30 + 1 + 2 x 5 = 41 s at most before the shutdown).

A collective can give up first: with ``resources.collective_timeout_s`` shorter than the heartbeat
timeout, the *healthy* rank waiting for the stopped one fails ("timed out" in gloo). Before
reporting that, the group asks :func:`stopped_rank` whether a rank still running has a
heartbeat that does not move for :data:`CONFIRM_S` seconds, and names that one instead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlcore.config.schema import DEFAULT_HEARTBEAT_TIMEOUT_S
from rlcore.errors import WorkerLostError

log = logging.getLogger(__name__)

__all__ = [
    "BEAT_S",
    "CONFIRM_S",
    "POLL_S",
    "TIMEOUT_KEY",
    "check_ranks",
    "start_heartbeat",
    "stopped_rank",
]

TIMEOUT_KEY = "resources.heartbeat_timeout_s"
BEAT_S = 1.0
# How often a waiting call reads the pending ranks' counters (the group passes it as the wait's
# poll): a read per pending rank per poll is cheap next to the bound it tightens (see above).
POLL_S = 0.5
CONFIRM_S = 2.5 * BEAT_S  # a counter still for this long, while its peers beat, is stopped
_NAMESPACE = "rlcore_heartbeat"
_started = threading.Event()


def _key(node_ip: str, pid: int) -> bytes:
    return f"{node_ip}:{pid}".encode()


def _kv() -> Any:
    from ray.experimental import internal_kv

    return internal_kv


def start_heartbeat(node_ip: str) -> None:
    """Start this process's heartbeat thread (once; later calls do nothing)."""
    if _started.is_set():
        return
    _started.set()
    key = _key(node_ip, os.getpid())

    def beat() -> None:
        kv = _kv()
        count = 0
        while True:
            count += 1
            try:
                kv._internal_kv_put(key, str(count).encode(), overwrite=True, namespace=_NAMESPACE)
            except Exception as err:  # the GCS is gone: the run is ending anyway
                log.debug("heartbeat stopped: %s", err)
                return
            time.sleep(BEAT_S)

    threading.Thread(target=beat, name="rlcore-heartbeat", daemon=True).start()


class _Seen:
    """The last counter value seen per process and when (driver's monotonic clock)."""

    def __init__(self) -> None:
        self.values: dict[bytes, tuple[bytes | None, float]] = {}


_seen = _Seen()


def check_ranks(
    role: str,
    process_info: Sequence[Mapping[str, Any]] | None,
    ranks: Sequence[int],
    method: str,
    timeout: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
) -> None:
    """Raise :class:`~rlcore.errors.WorkerLostError` for the first of ``ranks`` whose heartbeat
    has not moved for ``timeout`` seconds (``resources.heartbeat_timeout_s``)."""
    if not process_info or not ranks:
        return
    kv = _kv()
    now = time.monotonic()
    for rank in ranks:
        info = process_info[rank]
        key = _key(str(info["node_ip"]), int(info["pid"]))
        try:
            value = kv._internal_kv_get(key, namespace=_NAMESPACE)
        except Exception:  # GCS unreachable: Ray reports that itself
            return
        last, since = _seen.values.get(key, (None, now))
        if value != last or last is None:
            _seen.values[key] = (value, now)
            continue
        quiet = now - since
        if quiet > timeout:
            msg = (
                f"role {role} rank {rank} (node {info['node_ip']}, pid {info['pid']}) stopped "
                f"responding in {method}: no heartbeat for {quiet:.0f} s ({TIMEOUT_KEY} = "
                f"{timeout:g}); the process is stopped or wedged"
            )
            raise _lost(msg, role)


def stopped_rank(
    role: str,
    process_info: Sequence[Mapping[str, Any]] | None,
    ranks: Sequence[int],
    method: str,
    failed_rank: int,
    wait_s: float = CONFIRM_S,
) -> WorkerLostError | None:
    """The error naming the first of ``ranks`` whose heartbeat stands still for ``wait_s``
    seconds, None when every one of them beats (or nothing can be read).

    Called after ``failed_rank`` failed while ``ranks`` were still running: a collective that
    timed out in a healthy rank is the symptom, a stopped peer the cause.
    """
    if not process_info or not ranks:
        return None
    kv = _kv()
    keys = {r: _key(str(process_info[r]["node_ip"]), int(process_info[r]["pid"])) for r in ranks}

    def read() -> dict[int, bytes | None]:
        return {r: kv._internal_kv_get(k, namespace=_NAMESPACE) for r, k in keys.items()}

    try:
        before = read()
        time.sleep(wait_s)
        after = read()
    except Exception:  # GCS unreachable: Ray reports that itself
        return None
    for rank in ranks:
        if before[rank] is not None and before[rank] == after[rank]:
            info = process_info[rank]
            msg = (
                f"role {role} rank {rank} (node {info['node_ip']}, pid {info['pid']}) stopped "
                f"responding in {method}: no heartbeat for {wait_s:g} s while rank {failed_rank} "
                "gave up waiting for it (a collective timed out, resources.collective_timeout_s); "
                "the process is stopped or wedged"
            )
            return _lost(msg, role)
    return None


def _lost(msg: str, role: str) -> WorkerLostError:
    err = WorkerLostError(msg)
    err.role = role
    return err
