"""Failure handling around the Ray workers, in the test session's Ray.

- a rank left alone in a collective raises after the collective timeout
  (``resources.collective_timeout_s``; here ``init_process_group(timeout_s=)``), and the
  driver gets one ``WorkerError`` naming it;
- a rank that dies while the others block (in a collective, a long generate) is reported at
  once, not after the others finish;
- a rank that is stopped (SIGSTOP) while its peer waits in a collective is the one named when
  the peer's collective times out.

The same through ``rlcore train`` in a subprocess (kill, Ctrl-C, orphans, resume) is in
``test_faults_cli.py``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from pathlib import Path

import pytest

from rlcore.errors import WorkerError
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup
from rlcore.workers.resources import ResourcePool

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
fw = importlib.import_module("_faults_workers")

TIMEOUT_S = 5


@pytest.fixture
def group(ray_session, request):
    pool = ResourcePool([2], cpus_per_process=0.5, name=f"faults-{request.node.name[:40]}")
    # The helpers, and the same rlcore as this process (a checkout's sources, when on the path).
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {"env_vars": {"PYTHONPATH": path}}
    worker = ClassWithInitArgs(fw.FaultWorker, TIMEOUT_S)
    wg = RayWorkerGroup(pool, worker, role="faulty", runtime_env=env)
    yield wg
    wg.shutdown()
    pool.remove()


@pytest.mark.slow
def test_a_hang_in_a_collective_becomes_an_error_naming_the_waiting_rank(group):
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.all_reduce_without(1)
    took = time.monotonic() - start
    first = str(info.value).splitlines()[0]
    assert first.startswith("role faulty rank 0 failed in all_reduce_without: "), first
    assert "RuntimeError" in first or "DistBackendError" in first, first
    assert took < TIMEOUT_S + 20, took  # the timeout, not a hang (pytest-timeout is 600 s)


@pytest.mark.slow
def test_a_dead_rank_is_reported_while_the_others_still_block(group):
    pids = group.pid(0)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.wait_or_die(1)  # rank 0 sleeps 600 s: a rank-ordered ray.get would wait for it
    took = time.monotonic() - start
    first = str(info.value).splitlines()[0]
    assert re.match(
        rf"role faulty rank 1 \(node [\d.]+, pid {pids[1]}\) died in wait_or_die", first
    )
    assert "exit SYSTEM_ERROR" in first, first  # Ray's cause, on the first line
    assert took < 30, took


@pytest.mark.slow
def test_a_stopped_rank_is_named_not_the_peer_whose_collective_timed_out(group):
    """Issue 15: with 2 ranks and a collective timeout shorter than the heartbeat timeout, the
    error named the healthy rank 0 (its all-reduce timed out), not the SIGSTOPped rank 1."""
    from rlcore.workers.liveness import CONFIRM_S

    pids = group.pid(0)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.all_reduce_with_stopped(1)
    took = time.monotonic() - start
    text = str(info.value)
    assert "\n" not in text, text
    assert re.fullmatch(
        rf"role faulty rank 1 \(node [\d.]+, pid {pids[1]}\) stopped responding in "
        rf"all_reduce_with_stopped: no heartbeat for {CONFIRM_S:g} s while rank 0 gave up "
        r"waiting for it \(a collective timed out, resources\.collective_timeout_s\); the process "
        r"is stopped or wedged",
        text,
    ), text
    print(f"stopped rank named after {took:.1f} s (collective timeout {TIMEOUT_S} s)")
    assert took < TIMEOUT_S + CONFIRM_S + 20, took
