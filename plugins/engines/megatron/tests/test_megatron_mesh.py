"""Mesh dispatch with a TP=2 megatron engine on 2 Ray actors: one data shard per DP group.

With tensor parallelism both ranks form one data-parallel group: each must receive the same,
whole shard (not half of it, as plain data-parallel dispatch would send), and only the
collect rank's output may come back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import hf_logits, make_batch  # noqa: E402

from rlcore.resources import ResourcePool  # noqa: E402
from rlcore.workers import ClassWithInitArgs, RayWorkerGroup  # noqa: E402

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
