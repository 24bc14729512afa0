"""Resource pools on a real local Ray (4 logical CPUs, no GPU): placement and shortage errors."""

from __future__ import annotations

import pytest

from rlcore.errors import ResourceError
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup, Worker
from rlcore.workers.resources import ResourcePool, ResourcePoolManager


def _pg_table():
    import ray

    return {k: v["state"] for k, v in ray.util.placement_group_table().items()}


def test_shortage_is_reported_before_anything_starts(ray_session):
    before = _pg_table()
    manager = ResourcePoolManager(
        {"global_pool": ResourcePool([64], name="too_big")}, {"actor": "global_pool"}
    )
    expected = (
        r"^role actor needs 64 CPU bundles of 1 CPU \(64 CPU in all\), "
        r"the cluster has 4 CPU \(\d+(\.\d+)? free\); lower the process count or add nodes$"
    )
    with pytest.raises(ResourceError, match=expected):
        manager.check_resources()
    with pytest.raises(ResourceError, match=expected):
        manager.create_resource_pools()
    # a worker group on the pool fails the same way, before placing any actor
    with pytest.raises(ResourceError, match="role actor needs 64 CPU bundles"):
        RayWorkerGroup(manager.get_resource_pool("actor"), ClassWithInitArgs(Worker), role="actor")
    assert _pg_table() == before
    assert not manager.get_resource_pool("actor").created


def test_gpu_shortage_and_shared_pool_names_every_role(ray_session):
    before = _pg_table()
    gpu = ResourcePoolManager(
        {"gpu_pool": ResourcePool(nnodes=1, processes_per_node=2, use_gpu=True)},
        {"actor_rollout": "gpu_pool", "ref": "gpu_pool"},
    )
    with pytest.raises(
        ResourceError,
        match=r"^roles actor_rollout, ref need(s)? 2 GPU bundles of 1 CPU \+ 1 GPU .*"
        r"the cluster has 0 GPU",
    ):
        gpu.check_resources()
    assert _pg_table() == before


def test_pools_together_must_fit(ray_session):
    before = _pg_table()
    manager = ResourcePoolManager(
        {"a": ResourcePool([3], name="a"), "b": ResourcePool([3], name="b")},
        {"actor": "a", "critic": "b"},
    )
    with pytest.raises(ResourceError, match=r"role actor needs 3 CPU.*role critic needs 3 CPU"):
        manager.create_resource_pools()
    assert _pg_table() == before
    assert not manager.pools["a"].created


def test_pools_are_created_lazily_and_removed(ray_session):
    manager = ResourcePoolManager(
        {
            "train": ResourcePool([2], cpus_per_process=0.25, name="t_train"),
            "unused": ResourcePool([64], name="t_unused"),  # not mapped: never checked
        },
        {"actor": "train", "critic": "train"},
    )
    pool = manager.get_resource_pool("critic")
    assert not pool.created
    manager.create_resource_pools()
    assert pool.created
    assert not manager.pools["unused"].created
    locs = pool.locations()
    assert [(loc.bundle_index, loc.local_rank, loc.local_world_size) for loc in locs] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    pg_id = locs[0].placement_group.id.hex()
    assert _pg_table()[pg_id] == "CREATED"
    pool.remove()
    assert not pool.created
    assert _pg_table()[pg_id] == "REMOVED"


def test_configuration_errors():
    with pytest.raises(ResourceError, match="mapped to pool 'nope'"):
        ResourcePoolManager({"a": ResourcePool([1])}, {"actor": "nope"})
    with pytest.raises(ResourceError, match="positive ints"):
        ResourcePool([2, 0])
    with pytest.raises(ResourceError, match="nnodes and processes_per_node"):
        ResourcePool(nnodes=2)
    assert ResourcePool(nnodes=2, processes_per_node=3).world_size == 6
    with pytest.raises(ResourceError, match="max_colocate_count must be a positive int"):
        ResourcePool([1], max_colocate_count=0)


def test_colocation_shares_and_group_places():
    pool = ResourcePool([2], cpus_per_process=1.0, max_colocate_count=3, name="p3")
    # three shares never add up to more than the bundle (Ray rounds to 1e-4)
    assert pool.actor_share() == {"num_cpus": 0.3333, "num_gpus": 0.0}
    gpu = ResourcePool([1], use_gpu=True, cpus_per_process=2.0, max_colocate_count=2)
    assert gpu.actor_share() == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert ResourcePool([1]).max_colocate_count == 10  # verl's default
    for who in ("role actor", "role critic", "role ref"):
        pool.attach(who)
    with pytest.raises(ResourceError) as info:
        pool.attach("role reward")
    assert str(info.value) == (
        "pool 'p3' holds 3 groups (max_colocate_count=3: role actor, role critic, role ref); "
        "role reward asked for one more; raise max_colocate_count or give it another pool"
    )
    pool.detach("role critic")
    pool.attach("role reward")
    assert pool.groups == ["role actor", "role ref", "role reward"]


def test_placement_timeout_setting():
    from rlcore.errors import ConfigError

    assert ResourcePool([1]).ready_timeout_s == 120.0  # resources.placement_timeout_s's default
    assert ResourcePool([1], ready_timeout_s=3).ready_timeout_s == 3.0
    wait = r"ready_timeout_s must be a finite number > 0 and <= 9223372036 s \(a thread's wait\)"
    with pytest.raises(ConfigError, match=wait + ", got 0"):
        ResourcePool([1], ready_timeout_s=0)
