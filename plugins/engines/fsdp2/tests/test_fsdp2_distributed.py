"""FSDP2 over 2 gloo ranks (subprocesses) equals 1 rank on the same mini-batch."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlcore.testing.ranks import Ranks

torch.set_num_threads(1)

WORKER = Path(__file__).with_name("_fsdp2_dist_worker.py")


def _load_worker():
    spec = importlib.util.spec_from_file_location("_fsdp2_dist_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    tmp = tmp_path_factory.mktemp("fsdp2_dist")
    model_path = str(build_tiny_model(tmp / "model", hidden=64, heads=2, kv_heads=1))
    out_file = tmp / "two_ranks.pt"
    with Ranks([sys.executable, str(WORKER), model_path, str(out_file)]) as ranks:
        # The 1-rank reference runs here meanwhile (a private 1-rank group, destroyed after).
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            single = _load_worker().run(model_path)
        finally:
            dist.destroy_process_group()
        ranks.wait(timeout=300)
    return single, torch.load(out_file, weights_only=False)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["count", "tokens", "hsdp", "packed"])
def test_two_ranks_match_one_rank(results, scenario):
    single, double = results[0][scenario], results[1][scenario]
    assert double["loss"] == pytest.approx(single["loss"], abs=1e-6)
    assert double["grad_norm"] == pytest.approx(single["grad_norm"], abs=1e-5)
    for name, g in single["grads"].items():
        torch.testing.assert_close(double["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name)
    for name, p in single["params"].items():
        torch.testing.assert_close(double["params"][name], p, atol=1e-5, rtol=0, msg=name)


@pytest.mark.slow
def test_uneven_micro_batch_counts_were_exercised(results):
    # With the token budget rank 0 runs more micro-batches than rank 1; rank 1 pads with
    # zero-weight passes, and the gradient still matches (test above).
    counts = results[1]["tokens"]["micro_batches_per_rank"]
    assert counts[0] != counts[1], counts
    # And the token-mean gradient equals the count-split one (micro-batch invariance, 2 ranks).
    for name, g in results[1]["count"]["grads"].items():
        torch.testing.assert_close(
            results[1]["tokens"]["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name
        )


@pytest.mark.slow
def test_packed_two_ranks_match_padded(results):
    # Padding-free with uneven micro-batch counts (zero-weight passes on rank 1): the same
    # gradient as the padded token-budget split.
    counts = results[1]["packed"]["micro_batches_per_rank"]
    assert counts == [4, 2], counts
    for name, g in results[1]["tokens"]["grads"].items():
        torch.testing.assert_close(
            results[1]["packed"]["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name
        )


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["count", "tokens", "hsdp", "packed"])
def test_synced_tensors_equal_full_tensor_exactly(results, scenario):
    # Bucketed all-gathers give bit-identical tensors to per-parameter full_tensor(),
    # in the master dtype and cast to bf16, under every state_dict name (tied ones too).
    for name, run in zip(("1 rank", "2 ranks"), results, strict=True):
        assert run[scenario]["sync_mismatches"] == [], name


@pytest.mark.slow
def test_bucketed_gather_handles_uneven_and_empty_shards(results):
    for name, run in zip(("1 rank", "2 ranks"), results, strict=True):
        assert run["uneven"]["mismatches"] == [], name
