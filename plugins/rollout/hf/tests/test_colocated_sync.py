"""The colocated sync FSDP2 -> HF rollout moves no bytes on one rank, each tensor once on two.

After a training step the rollout generates from the updated weights: its greedy log-probs
equal the engine's recomputation on the same tokens (``_colocated_sync.run``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlcore.testing.ranks import Ranks

torch.set_num_threads(1)

HELPER = Path(__file__).with_name("_colocated_sync.py")
IN_SYNC = 1e-5  # float32, same kernels: rounding only
STALE = 1e-3  # one step at lr 5e-2 moves greedy log-probs far more


def _helper():
    spec = importlib.util.spec_from_file_location("_colocated_sync", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tied_path(tmp_path_factory) -> str:
    from rlcore.testing.tiny_model import build_tiny_model

    folder = tmp_path_factory.mktemp("colocated") / "model"
    return str(build_tiny_model(folder, hidden=64, heads=2, kv_heads=1, tie_word_embeddings=True))


def _one_rank(path: str, rollout_dtype: str) -> dict[str, float]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        return _helper().run(path, rollout_dtype)
    finally:
        dist.destroy_process_group()


def test_one_rank_shares_the_actors_storage(tied_path):
    result = _one_rank(tied_path, "float32")
    assert result["first_sync_bytes"] == result["sync_bytes"] == 0
    # The rollout read the step's weights before any sync: it holds the actor's tensors.
    assert result["gap_before_sync"] < IN_SYNC, result
    assert result["gap_after_sync"] < IN_SYNC, result


def test_another_dtype_streams_each_tensor_once(tied_path):
    # A bfloat16 rollout of a float32 actor needs a cast: every distinct float32 tensor once,
    # the tied embedding once.
    result = _one_rank(tied_path, "bfloat16")
    assert result["sync_bytes"] == result["model_bytes"] > 0, result
    assert result["gap_before_sync"] > STALE, result  # a copy: stale until synced


@pytest.mark.slow
def test_two_ranks_gather_each_tensor_once(tied_path, tmp_path):
    out = tmp_path / "two_ranks.pt"
    with Ranks([sys.executable, str(HELPER), tied_path, str(out)]) as ranks:
        ranks.wait(timeout=300)
    result = torch.load(out, weights_only=True)
    assert result["sync_bytes"] == result["model_bytes"] > 0, result
    assert result["gap_before_sync"] > STALE, result
    assert result["gap_after_sync"] < IN_SYNC, result
