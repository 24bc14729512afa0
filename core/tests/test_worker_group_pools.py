"""Several worker groups on one pool, bounded waits, async role methods: on real Ray actors.

Timeouts here are short (2 s) so a regression to an unbounded wait fails the test through
pytest-timeout instead of passing slowly; the elapsed times are checked only loosely (under
contention on shared CPUs), the exact bound is the group's setting.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

import pytest

from rlcore.errors import ResourceError, WorkerGroupError, WorkerTimeoutError
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from rlcore.workers.colocate import AsyncColocatedWorker, ColocatedWorker
from rlcore.workers.resources import ResourcePool

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
wp = importlib.import_module("_workers_pool")
# The workers import the test helpers and the same rlcore as this process (a checkout's
# sources on PYTHONPATH, when the tests run from one).
_PATH = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": _PATH}}


def _actor_states() -> dict[str, str]:
    from ray._private import state

    return {k: v["State"] for k, v in state.actors().items()}


def _live(states: dict[str, str]) -> set[str]:
    return {k for k, v in states.items() if v != "DEAD"}


@pytest.mark.timeout(180)
def test_actor_and_critic_share_a_pool_and_a_third_is_refused(ray_session):
    pool = ResourcePool([2], cpus_per_process=0.5, max_colocate_count=2, name="test_shared_pool")
    actor = critic = None
    try:
        actor = RayWorkerGroup(
            pool, ClassWithInitArgs(wp.SideWorker), role="actor", runtime_env=RUNTIME_ENV
        )
        critic = RayWorkerGroup(
            pool, ClassWithInitArgs(wp.SideWorker), role="critic", runtime_env=RUNTIME_ENV
        )
        a, c = actor.where(), critic.where()
        assert [w["role"] for w in a + c] == ["actor", "actor", "critic", "critic"]
        # Same placement group (the pool's), half a bundle each, four distinct processes.
        assert len({w["pg"] for w in a + c}) == 1
        assert [w["cpus"] for w in a + c] == [0.25] * 4
        assert len({w["pid"] for w in a + c}) == 4
        # Side by side: both groups' calls are in flight at once and overlap in time.
        fa, fc = actor.busy(1.0), critic.busy(1.0)
        spans = fa.get() + fc.get()
        assert max(s for s, _ in spans) < min(e for _, e in spans)
        assert pool.groups == ["role actor", "role critic"]

        before = _live(_actor_states())
        t0 = time.monotonic()
        with pytest.raises(ResourceError) as info:
            RayWorkerGroup(
                pool, ClassWithInitArgs(wp.SideWorker), role="reward", runtime_env=RUNTIME_ENV
            )
        elapsed = time.monotonic() - t0
        text = str(info.value)
        assert "\n" not in text
        assert text == (
            "pool 'test_shared_pool' holds 2 groups (max_colocate_count=2: role actor, "
            "role critic); role reward asked for one more; raise max_colocate_count or give it "
            "another pool"
        )
        assert elapsed < 30.0, elapsed
        assert _live(_actor_states()) == before  # no actor was started for the third group
        print(f"third group refused after {elapsed:.3f} s")

        # A group that leaves gives its place back.
        critic.shutdown()
        critic = RayWorkerGroup(
            pool, ClassWithInitArgs(wp.SideWorker), role="critic2", runtime_env=RUNTIME_ENV
        )
        assert [w["role"] for w in critic.where()] == ["critic2", "critic2"]
    finally:
        for g in (actor, critic):
            if g is not None:
                g.shutdown()
        pool.remove()


@pytest.mark.timeout(120)
def test_unplaceable_actor_times_out_naming_pool_and_ranks(ray_session):
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pool = ResourcePool([1], cpus_per_process=0.5, max_colocate_count=1, name="test_held_pool")
    blocker = None
    try:
        pg = pool.placement_groups()[0]
        # Another job's actor sits in the pool's only bundle and holds all of it.
        blocker = (
            ray.remote(wp.Blocker)
            .options(
                num_cpus=0.5,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=0
                ),
                runtime_env=RUNTIME_ENV,
            )
            .remote()
        )
        assert ray.get(blocker.ready.remote(), timeout=60)
        before = _live(_actor_states())
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            RayWorkerGroup(
                pool,
                ClassWithInitArgs(wp.SideWorker),
                role="critic",
                runtime_env=RUNTIME_ENV,
                start_timeout_s=2.0,
            )
        elapsed = time.monotonic() - t0
        text = str(info.value)
        assert text.startswith(
            "role critic: ranks [0] did not start within 2 s (resources.start_timeout_s): "
            "ranks [0] not placed in their bundles of pool 'test_held_pool' "
            "(no process yet; each actor asks 0.5 CPU"
        ), text
        assert 2.0 <= elapsed < 30.0, elapsed
        print(f"unplaceable group failed after {elapsed:.3f} s")
        # The pending actor was killed and the pool's place given back.
        assert pool.groups == []
        deadline = time.monotonic() + 10
        while _live(_actor_states()) != before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _live(_actor_states()) == before
    finally:
        if blocker is not None:
            ray.kill(blocker)
        pool.remove()


@pytest.mark.timeout(120)
def test_init_that_never_ends_times_out(ray_session):
    # 10 s, not 2: the worker process itself must have started for the error to say "still in
    # __init__", and starting one takes seconds on shared, busy CPUs.
    pool = ResourcePool([1], cpus_per_process=0.5, name="test_slow_init")
    try:
        t0 = time.monotonic()
        with pytest.raises(
            WorkerTimeoutError,
            match=r"^role slow: ranks \[0\] did not start within 10 s "
            r"\(resources\.start_timeout_s\): ranks \[0\] still in __init__ \(pids \d+;",
        ):
            RayWorkerGroup(
                pool,
                ClassWithInitArgs(wp.SlowInitWorker),
                role="slow",
                runtime_env=RUNTIME_ENV,
                start_timeout_s=10.0,
            )
        elapsed = time.monotonic() - t0
        assert 10.0 <= elapsed < 30.0, elapsed
        print(f"endless __init__ failed after {elapsed:.3f} s")
        assert pool.groups == []
    finally:
        pool.remove()


@pytest.mark.timeout(120)
def test_method_that_never_returns_times_out(ray_session):
    pool = ResourcePool([2], cpus_per_process=0.5, name="test_hang_pool")
    wg = None
    try:
        wg = RayWorkerGroup(
            pool,
            ClassWithInitArgs(wp.HangWorker),
            role="actor",
            runtime_env=RUNTIME_ENV,
            call_timeout_s=2,  # a run's resources.call_timeout_s
        )
        assert wg.ping() == [0, 1]
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeoutError) as info:
            wg.hang()
        elapsed = time.monotonic() - t0
        assert str(info.value).startswith(
            "role actor: method hang on ranks [0, 1] did not return within 2 s "
            "(resources.call_timeout_s)"
        )
        assert isinstance(info.value, TimeoutError)
        assert 2.0 <= elapsed < 30.0, elapsed
        print(f"hung method failed after {elapsed:.3f} s")
        # A non-blocking call is bounded the same way when its result is asked for.
        fut = wg.hang_later()
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match="method hang_later on ranks"):
            fut.get()
        assert time.monotonic() - t0 < 30.0
    finally:
        if wg is not None:
            wg.shutdown()
        pool.remove()


@pytest.mark.timeout(180)
def test_async_role_methods_are_awaited_in_colocated_and_plain_groups(ray_session):
    roles = {
        "gen": ClassWithInitArgs(wp.AsyncRole),
        "side": ClassWithInitArgs(wp.SideWorker),
    }
    cls = create_colocated_worker_cls(roles)
    assert cls.cls is AsyncColocatedWorker
    assert create_colocated_worker_cls({"side": roles["side"]}).cls is ColocatedWorker
    pool = ResourcePool([2], cpus_per_process=0.5, max_colocate_count=2, name="test_async_pool")
    fused = plain = None
    try:
        fused = RayWorkerGroup(pool, cls, role="fused", runtime_env=RUNTIME_ENV)
        views = fused.spawn()
        assert views["gen"].agen(3) == [30, 31]
        assert fused.gen_agen(4) == [40, 41]
        assert views["gen"].sync_rank() == [0, 1]
        assert [w["rank"] for w in views["side"].where()] == [0, 1]
        plain = RayWorkerGroup(
            pool, ClassWithInitArgs(wp.AsyncRole), role="gen", runtime_env=RUNTIME_ENV
        )
        assert plain.agen(3) == [30, 31]
    finally:
        for g in (fused, plain):
            if g is not None:
                g.shutdown()
        pool.remove()


def test_protected_env_in_runtime_env_is_refused(ray_session):
    pool = ResourcePool([1], cpus_per_process=0.5, name="test_protected_env")
    before = _live(_actor_states())
    env = {"env_vars": {"PYTHONPATH": str(HERE), "WORLD_SIZE": "8", "MASTER_PORT": "1"}}
    with pytest.raises(WorkerGroupError) as info:
        RayWorkerGroup(pool, ClassWithInitArgs(wp.SideWorker), role="actor", runtime_env=env)
    assert isinstance(info.value, ValueError)  # verl raises ValueError
    assert str(info.value).startswith(
        "role actor: Cannot override protected system env ['MASTER_PORT', 'WORLD_SIZE']"
    )
    assert not pool.created
    assert pool.groups == []
    assert _live(_actor_states()) == before
