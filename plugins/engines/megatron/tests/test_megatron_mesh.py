"""Mesh dispatch with a TP=2 megatron engine on 2 Ray actors: one data shard per DP group.

With tensor parallelism both ranks form one data-parallel group: each must receive the same,
whole shard (not half of it, as plain data-parallel dispatch would send), and only the
collect rank's output may come back. First with a bare worker calling the engine, then
through rlcore's real ``CriticWorker`` (its registered methods, the driver's update layout).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import hf_logits, make_batch  # noqa: E402

from rlcore.protocol import DataProto  # noqa: E402
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup  # noqa: E402
from rlcore.workers.resources import ResourcePool  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("mesh") / "model"))


@pytest.fixture(scope="module")
def group(ray_session, tiny_path):
    import _megatron_workers

    pool = ResourcePool([2], cpus_per_process=0.5, name="test_megatron_mesh")
    wg = RayWorkerGroup(
        pool,
        ClassWithInitArgs(_megatron_workers.MegatronLogProbWorker),
        role="ref",
        runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}},
    )
    yield wg
    wg.shutdown()
    pool.remove()


@pytest.mark.slow
def test_each_data_parallel_shard_is_sent_once_and_collected_once(group, tiny_path):
    infos = group.init_model(tiny_path, 2)
    assert infos == [
        {"dp_rank": 0, "dp_size": 1, "is_collect": True},
        {"dp_rank": 0, "dp_size": 1, "is_collect": False},
    ]
    batch = make_batch(rows=4)
    out = group.compute_ref_log_prob(batch)
    received = group.pop_received()

    # one call per rank, and both TP ranks got the one DP shard: all 4 rows, in order
    assert [len(calls) for calls in received] == [1, 1]
    rows = batch.batch["input_ids"][:, 0].tolist()
    assert [calls[0]["rows"] for calls in received] == [rows, rows]
    shard_bytes = sum(t.numel() * t.element_size() for t in batch.batch.values())
    assert [calls[0]["bytes"] for calls in received] == [shard_bytes, shard_bytes]

    # collected from the collect rank only: 4 rows, not 8, equal to transformers
    log_probs = out.batch["ref_log_prob"]
    assert log_probs.shape == batch.batch["responses"].shape
    r = log_probs.shape[1]
    logits = hf_logits(tiny_path, batch)[:, -(r + 1) : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, batch.batch["responses"][..., None])
    assert float((log_probs - expected[..., 0]).abs().max()) < 1e-5


@pytest.fixture
def critic_group(ray_session, tiny_path, group):
    import _megatron_workers

    from rlcore.interfaces import EngineSpec, OptimConfig
    from rlcore.plugins import Component
    from rlcore.trainer.specs import CriticSpec, EngineRole, UpdateSpec
    from rlcore_megatron.engine import MegatronEngine

    group.shutdown()  # the bare workers' slots (and their parallel state) go first
    optim = OptimConfig(lr=1e-3)
    spec = CriticSpec(
        backend="gloo",
        critic=EngineRole(
            engine=Component(
                kind="engine",
                name="megatron",
                options=MegatronEngine.Config(tensor_parallel=2),
                where="[critic.engine]",
            ),
            spec=EngineSpec(
                role="critic",
                model_path=tiny_path,
                optim=optim,
                total_steps=10,
                micro_batch_size=2,
                value_head=True,
            ),
        ),
        algorithm=Component(kind="algorithm", name="ppo", where="[algorithm]"),
        update=UpdateSpec(
            rows_per_mini_batch=2,
            mini_batches=2,
            epochs=1,
            shuffle=False,
            seed=0,
            optim=optim,
            schedule_steps=10,
        ),
    )
    pool = ResourcePool([2], cpus_per_process=0.5, name="test_megatron_mesh_critic")
    wg = RayWorkerGroup(
        pool,
        ClassWithInitArgs(_megatron_workers.RecordingCriticWorker, spec),
        role="critic",
        runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}},
    )
    yield wg
    wg.shutdown()
    pool.remove()


@pytest.mark.slow
def test_the_critic_role_sends_each_data_parallel_shard_once(critic_group):
    from rlcore.roles.mesh import CRITIC_MESH
    from rlcore.roles.policy import POLICY_INPUT_KEYS
    from rlcore.trainer.layout import mini_batch_layout

    critic_group.init_model()
    infos = critic_group.dispatch_info(CRITIC_MESH)
    assert [(i.dp_rank, i.dp_size, i.is_collect) for i in infos] == [(0, 1, True), (0, 1, False)]

    batch = make_batch(rows=4)
    model_in = batch.select(batch_keys=list(POLICY_INPUT_KEYS))
    model_bytes = sum(t.numel() * t.element_size() for t in model_in.batch.values())
    values = critic_group.compute_values(model_in).batch["values"]
    assert values.shape == batch.batch["responses"].shape  # 4 rows back, not 8
    assert torch.isfinite(values).all()

    update_in = model_in.union(  # union adds to model_in in place
        DataProto.from_dict(tensors={"values": values, "returns": values + 0.5})
    )
    # the driver's layout for one data-parallel rank: 2 mini-batches of 2 rows
    laid = mini_batch_layout(update_in, rows_per_mini_batch=2, world_size=infos[0].dp_size)
    out = critic_group.update_critic(laid, 0)
    metrics = out.meta_info["metrics"]
    assert len(metrics["critic/grad_norm"]) == 2  # two optimizer steps, from the collect rank
    assert metrics["critic/nonfinite"] == [0.0, 0.0]

    received = critic_group.pop_received()
    rows = batch.batch["input_ids"][:, 0].tolist()
    update_bytes = sum(t.numel() * t.element_size() for t in laid.batch.values())
    for calls in received:  # both TP ranks: each call once, with every row
        assert [c["method"] for c in calls] == ["compute_values", "update_critic"]
        assert [c["rows"] for c in calls] == [rows, laid.batch["input_ids"][:, 0].tolist()]
        assert [c["bytes"] for c in calls] == [model_bytes, update_bytes]


def test_gradient_all_reduce_flattens_at_most_one_bucket_at_a_time(monkeypatch):
    """Data-parallel gradients are summed in buckets: the extra buffer is bounded by the
    bucket, not the model (one buffer of every gradient doubled gradient memory at 7B)."""
    import torch
    import torch.distributed as dist

    from rlcore_megatron import parallel

    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sizes: list[int] = []
        original = dist.all_reduce

        def spy(tensor, *args, **kwargs):
            sizes.append(tensor.numel())
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(parallel.dist, "all_reduce", spy)
        grads = [torch.full((n,), float(n)) for n in (3, 5, 40, 2, 2)]
        expected = [g.clone() for g in grads]
        parallel._all_reduce_coalesced(grads, dist.group.WORLD, bucket_bytes=8 * 4)
        # buckets of <= 8 floats: [3, 5], [40] alone (in place), [2, 2]
        assert sizes == [8, 40, 4]
        for got, want in zip(grads, expected, strict=True):
            assert torch.equal(got, want)  # one rank: the sum is the gradient itself
        sizes.clear()
        parallel._all_reduce_coalesced(grads, dist.group.WORLD)  # default: one bucket here
        assert sizes == [52]
    finally:
        if own:
            dist.destroy_process_group()
