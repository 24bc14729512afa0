"""Every dispatch mode on a real 2-actor Ray worker group (no mocked Ray)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.dispatch import (
    Dispatch,
    DispatchError,
    GroupFuture,
    get_dispatch_mode,
    register,
    register_dispatch_mode,
)
from rlcore.protocol import DataProto
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup
from rlcore.workers.resources import ResourcePool

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
wd = importlib.import_module("_workers_dispatch")
# Ray puts only the driver's working directory on the workers' path; the helpers live here.
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": str(HERE)}}


def make_data(n: int) -> DataProto:
    uid = np.array([f"u{i}" for i in range(n)], dtype=object)
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)}, non_tensors={"uid": uid}
    )


@pytest.fixture(scope="module")
def wg(ray_session):
    pool = ResourcePool([2], cpus_per_process=0.5, name="test_dispatch")
    group = RayWorkerGroup(
        pool, ClassWithInitArgs(wd.DispatchWorker, offset=10), role="dp", runtime_env=RUNTIME_ENV
    )
    yield group
    group.shutdown()
    pool.remove()


def test_worker_env_and_threads(wg):
    envs = wg.env()
    assert [e["rank"] for e in envs] == [0, 1]
    assert {e["world_size"] for e in envs} == {2}
    assert [e["local_rank"] for e in envs] == [0, 1]
    # one master address/port shared by all ranks, a real port
    assert len({e["master"] for e in envs}) == 1
    assert envs[0]["master"][1] > 0
    # pinned to the CPU share (0.5 CPU -> one thread)
    assert {e["threads"] for e in envs} == {1}
    assert {e["omp"] for e in envs} == {"1"}
    assert len({e["pid"] for e in envs} | {os.getpid()}) == 3


def test_one_to_all_and_all_to_all(wg):
    assert wg.whoami("hi") == [(0, "hi", 2), (1, "hi", 2)]
    assert wg.add_rank([10, 20]) == [10, 21]
    with pytest.raises(DispatchError, match="must be a list of 2 items"):
        wg.add_rank([1, 2, 3])


def test_dp_compute(wg):
    assert wg.double([1, 2]) == [12, 14]
    with pytest.raises(DispatchError, match="one per rank"):
        wg.double(5)


@pytest.mark.parametrize("n", [4, 5, 1])
def test_dp_compute_proto_even_and_uneven(wg, n):
    data = make_data(n)
    out = wg.scale(data, factor=3.0)
    assert len(out) == n  # padding removed
    assert torch.equal(out.batch["y"], data.batch["x"] * 3.0)
    assert list(out.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])
    # rows are split in order: the first ceil(n/2) on rank 0
    half = -(-n // 2)
    assert out.batch["rank"].tolist() == [0.0] * half + [1.0] * (n - half)


def test_dp_compute_proto_kwargs_and_length_mismatch(wg):
    out = wg.scale(data=make_data(3), factor=2.0)
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(DispatchError, match="same length"):
        wg.scale(make_data(3), make_data(4))


def test_dp_compute_proto_with_func(wg):
    out = wg.apply(torch.neg, make_data(5))
    assert out.batch["y"].tolist() == [0.0, -1.0, -2.0, -3.0, -4.0]
    with pytest.raises(DispatchError, match="function as first argument"):
        wg.apply(make_data(2))


def test_dp_compute_metric_is_per_rank_list(wg):
    metrics = wg.count(make_data(3))  # padded to 4: rank 0 rows 0,1; rank 1 rows 2,0
    assert [m["rank"] for m in metrics] == [0, 1]
    assert [m["rows"] for m in metrics] == [2, 2]
    assert [m["sum"] for m in metrics] == [1.0, 2.0]


def test_execute_rank_zero(wg):
    rank, pid = wg.only_rank_zero()
    assert rank == 0
    assert pid == wg.process_info[0]["pid"]


def test_custom_mode_by_name(wg):
    assert wg.times_rank(5) == 5 * 1 + 5 * 2


def test_custom_mode_by_dispatch_member(wg):
    # registered as "test_max_with_rank", used as Dispatch.TEST_MAX_WITH_RANK (verl style)
    assert wg.times_rank_max(5) == 10


def test_inline_dict_dispatch_mode_and_verl_execute_names(wg):
    # verl's functions take the worker group; a DispatchCall has the same world_size
    assert wg.echo_inline(7) == [(1, 8), (0, 7)]
    assert wg.execute_rank_zero("add_rank", 3) == 3
    assert wg.execute_all_sync("add_rank", 3) == [3, 4]
    with pytest.raises(DispatchError, match=r"needs callables under \['collect_fn'\]"):
        register(dispatch_mode={"dispatch_fn": wd.verl_style_dispatch})
    with pytest.raises(DispatchError, match="already used with another collect_fn"):
        register(dispatch_mode={"dispatch_fn": wd.verl_style_dispatch, "collect_fn": len})


def test_dispatch_is_extendable_by_name():
    member = Dispatch.register("test_declared_only")
    try:
        assert member == "TEST_DECLARED_ONLY"
        assert Dispatch.TEST_DECLARED_ONLY is member
        assert member.name == member.value == "TEST_DECLARED_ONLY"
        assert "TEST_DECLARED_ONLY" in Dispatch
        assert Dispatch["TEST_DECLARED_ONLY"] is member
        assert Dispatch.from_name("test_declared_only") is member
        assert "DP_COMPUTE_PROTO" in Dispatch.names()
        assert Dispatch.DP_COMPUTE_PROTO in list(Dispatch)
        with pytest.raises(DispatchError, match="TEST_DECLARED_ONLY already registered"):
            Dispatch.register("TEST_DECLARED_ONLY")
        with pytest.raises(ValueError, match="already registered"):  # verl raises ValueError
            Dispatch.register("DP_COMPUTE_PROTO")
        # declared but without functions: a clear error when a group is built
        with pytest.raises(DispatchError, match=r"declared with Dispatch\.register but given no"):
            get_dispatch_mode(Dispatch.TEST_DECLARED_ONLY)
        # functions added later attach to the declared member
        assert register_dispatch_mode(member, lambda c: ((), {}), lambda c, o: o) is member
        assert get_dispatch_mode("test_declared_only").name == "TEST_DECLARED_ONLY"
    finally:
        Dispatch.remove("TEST_DECLARED_ONLY")
    assert "TEST_DECLARED_ONLY" not in Dispatch
    assert not hasattr(Dispatch, "TEST_DECLARED_ONLY")


def test_custom_mode_registration_errors():
    with pytest.raises(DispatchError, match="already registered"):
        register_dispatch_mode(wd.SUM_MODE, lambda c: ((), {}), lambda c, o: o)
    with pytest.raises(DispatchError, match="unknown execute mode"):
        register(execute_mode="SOMETIMES")


def test_unknown_mode_fails_when_group_is_built(ray_session):
    class Bad(wd.DispatchWorker):
        @register(dispatch_mode="NO_SUCH_MODE")
        def f(self):
            return 1

    pool = ResourcePool([1], cpus_per_process=0.5, name="unused_bad_mode")
    with pytest.raises(DispatchError, match="unknown dispatch mode 'NO_SUCH_MODE'"):
        RayWorkerGroup(pool, ClassWithInitArgs(Bad), role="bad")
    assert not pool.created  # nothing was placed


def test_future_chains_worker_to_worker(wg):
    wd.UNPICKLED_PIDS.clear()
    data = make_data(5)  # uneven: the padding travels with the shards and is removed at the end
    fut = wg.stamp(data)
    assert isinstance(fut, GroupFuture)
    assert fut.pad_size == 1
    out = wg.consume(fut)
    assert out.batch["x"].tolist() == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert out.batch["orig"].tolist() == [0, 1, 2, 3, 4]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    # the intermediate DataProto (with its Tracer objects) was unpickled only in the workers
    assert wd.UNPICKLED_PIDS == []
    worker_unpickles = [e["unpickled"] for e in wg.env()]
    assert all(worker_unpickles)
    # control: resolving the future on the driver does unpickle it here
    assert len(fut.get()) == 5
    assert wd.UNPICKLED_PIDS
    assert set(wd.UNPICKLED_PIDS) == {os.getpid()}


def test_future_list_chain_and_get(wg):
    fut = wg.plus_one_async([1, 2])
    assert fut.chainable("list", 2)
    assert wg.double(fut) == [2 * 2 + 10, 2 * 3 + 10]
    assert fut.get() == [2, 3]
    # a future with the wrong layout for the next call is resolved on the driver first
    fut2 = wg.plus_one_async([1, 2])
    assert wg.whoami(fut2) == [(0, [2, 3], 2), (1, [2, 3], 2)]
