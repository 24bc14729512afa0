"""RayWorkerGroup on real Ray actors: mesh dispatch, chaining across groups, colocation,
torch.distributed, and remote failures reported with role and rank."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.dispatch import DispatchError, GroupFuture
from rlcore.errors import WorkerError
from rlcore.protocol import DataProto
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from rlcore.workers.resources import ResourcePool

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
wg_mod = importlib.import_module("_workers_group")
wd = importlib.import_module("_workers_dispatch")
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": str(HERE)}}


def make_data(n: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.arange(n, dtype=torch.float32)})


def _group(name, counts, cls_with_init, role):
    pool = ResourcePool(counts, cpus_per_process=0.5, name=name)
    return pool, RayWorkerGroup(pool, cls_with_init, role=role, runtime_env=RUNTIME_ENV)


@pytest.fixture(scope="module")
def dist_wg(ray_session):
    pool, group = _group("test_wg_dist", [2], ClassWithInitArgs(wg_mod.DistWorker), "actor")
    yield group
    group.shutdown()
    pool.remove()


@pytest.fixture(scope="module")
def mesh_wg(ray_session):
    pool, group = _group("test_wg_mesh", [4], ClassWithInitArgs(wg_mod.MeshWorker, tp=2), "mesh")
    yield group
    group.shutdown()
    pool.remove()


def test_remote_exception_names_role_rank_and_traceback(dist_wg):
    with pytest.raises(WorkerError) as info:
        dist_wg.maybe_fail(1)
    text = str(info.value)
    first = text.splitlines()[0]
    assert first == "role actor rank 1 failed in maybe_fail: ValueError: boom on rank 1"
    assert "remote traceback:" in text
    assert "\x1b[" not in text  # no terminal colour codes
    assert "_workers_group.py" in text  # the remote frame
    assert dist_wg.maybe_fail(-1) == [0, 1]  # the group still works


def test_an_rlcore_error_in_a_worker_is_its_one_line(dist_wg):
    """A condition the worker refuses on purpose (an RlcoreError naming a key) reaches the
    driver as one line naming role, rank and method, without the remote traceback."""
    with pytest.raises(WorkerError) as info:
        dist_wg.refuse(1)
    assert str(info.value) == (
        "role actor rank 1 failed in refuse: [actor.engine] some_key = 3 cannot run on rank 1; "
        "set 1"
    )
    assert type(info.value.remote_cause).__name__ == "ConfigError"
    assert dist_wg.refuse(-1) == [0, 1]


def test_all_reduce_across_two_actors(dist_wg):
    # gloo all_reduce: 3*1 + 3*2
    assert dist_wg.all_reduce(3.0) == [9.0, 9.0]


def test_mesh_dispatch_dp2_tp2(mesh_wg):
    infos = mesh_wg.dispatch_info()
    assert [(i.dp_rank, i.dp_size, i.is_collect) for i in infos] == [
        (0, 2, True),
        (0, 2, False),
        (1, 2, True),
        (1, 2, False),
    ]
    out = mesh_wg.forward(make_data(5))  # uneven: padded to 6, 3 rows per dp group
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert out.batch["rank"].tolist() == [0.0, 0.0, 0.0, 2.0, 2.0]
    seen = mesh_wg.pop_seen()
    # both tp ranks of a dp group got the same chunk
    assert seen[0] == seen[1] == [[0.0, 1.0, 2.0]]
    assert seen[2] == seen[3] == [[3.0, 4.0, 0.0]]


def test_mesh_compute_lists(mesh_wg):
    assert mesh_wg.mesh_items(["a", "b"]) == [("a", 0), ("b", 2)]
    with pytest.raises(DispatchError, match="list of 2 items"):
        mesh_wg.mesh_items(["a", "b", "c", "d"])


def test_named_mesh_and_chaining_between_meshes(mesh_wg):
    wd.UNPICKLED_PIDS.clear()
    fut = mesh_wg.generate(make_data(8))  # "rollout" mesh: 4 dp ranks, 2 rows each
    assert isinstance(fut, GroupFuture)
    assert fut.chainable("proto", 4)
    # 4 shards into a dp=2 mesh: layouts differ, so it is resolved on the driver first
    out = mesh_wg.forward(fut)
    assert out.batch["y"].tolist() == [2.0 * (1000 + i) for i in range(8)]
    got = fut.get()
    assert got.batch["gen_rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_future_chains_into_another_group_with_matching_dp(mesh_wg, dist_wg):
    wd.UNPICKLED_PIDS.clear()
    fut = dist_wg.stamp(make_data(6))  # 2 shards: one per dp rank of the dp=2 mesh group
    assert dist_wg.consume(fut).batch["orig"].tolist() == list(range(6))
    out = mesh_wg.forward(fut)  # shard i goes to both tp ranks of dp group i
    assert out.batch["y"].tolist() == [2.0 * (100 + i) for i in range(6)]
    assert out.batch["rank"].tolist() == [0.0] * 3 + [2.0] * 3
    assert wd.UNPICKLED_PIDS == []  # never materialised on the driver


def test_colocated_roles_share_a_process(ray_session):
    cls = create_colocated_worker_cls(
        {
            "actor": ClassWithInitArgs(wg_mod.ActorRole, lr=0.5),
            "ref": ClassWithInitArgs(wg_mod.RefRole),
        }
    )
    pool, fused = _group("test_wg_fused", [2], cls, "fused")
    try:
        actor_pids = fused.actor_pid()
        ref_pids = fused.ref_pid()
        assert [p[0] for p in actor_pids] == [p[0] for p in ref_pids]
        assert [p[0] for p in actor_pids] == [i["pid"] for i in fused.process_info]
        assert [p[2] for p in actor_pids] == [0.5, 0.5]
        views = fused.spawn()
        assert set(views) == {"actor", "ref"}
        out = views["actor"].update(make_data(3))
        assert out.batch["x"].tolist() == [0.0, 0.5, 1.0]
        assert out.batch["rank"].tolist() == [0.0, 0.0, 1.0]
        # the ref role declared its own mesh (one dp group, rank 0 collects)
        ref = views["ref"].ref_log_prob(make_data(3))
        assert ref.batch["ref"].tolist() == [0.0, -1.0, -2.0]
        assert ref.batch["rank"].tolist() == [0.0, 0.0, 0.0]
        assert fused.ref_ref_log_prob(make_data(2)).batch["ref"].tolist() == [0.0, -1.0]
        with pytest.raises(AttributeError, match=r"registered: .*actor_update"):
            fused.update  # noqa: B018 - un-prefixed names live on the views
    finally:
        fused.shutdown()
        pool.remove()


def test_non_worker_class_is_rejected(ray_session):
    pool = ResourcePool([1], cpus_per_process=0.5, name="unused_non_worker")
    with pytest.raises(TypeError, match=r"subclass of rlcore\.workers\.Worker"):
        RayWorkerGroup(pool, ClassWithInitArgs(np.ndarray), role="x")
    assert not pool.created


def test_dead_actor_names_role_rank_node(dist_wg):
    # Last test using dist_wg: it leaves rank 1 dead.
    with pytest.raises(WorkerError) as info:
        dist_wg.die(1)
    first = str(info.value).splitlines()[0]
    node, pid = dist_wg.process_info[1]["node_ip"], dist_wg.process_info[1]["pid"]
    assert first.startswith(f"role actor rank 1 (node {node}, pid {pid}) died in die:")
