"""MegatronEngine on 2 gloo processes: TP=2, PP=2 (tied embeddings) and DP=2 equal one process.

One launch of 2 subprocesses runs the three layouts in turn; the references (transformers'
logits, FSDP2's parameters after the same optimizer step) are computed here meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _common import hf_logits, make_batch, token_mean_loss, valid_max_diff, zero_advantage_batch

from rlcore.testing.ranks import Ranks

torch.set_num_threads(1)

WORKER = Path(__file__).with_name("_megatron_dist_worker.py")
# scenario -> (tensor_parallel, pipeline_parallel, model)
SCENARIOS = {"tp2": (2, 1, "untied"), "pp2": (1, 2, "tied"), "dp2": (1, 1, "untied")}


def _fsdp2_reference(model_path: str) -> dict:
    """transformers' logits and FSDP2's parameters after one step, in a private 1-rank group."""
    from rlcore.interfaces import EngineSpec, OptimConfig

    fsdp2 = pytest.importorskip("rlcore_fsdp2.engine")
    batch = make_batch()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        spec = EngineSpec(
            role="actor", model_path=model_path, optim=OptimConfig(lr=1e-3), micro_batch_size=2
        )
        engine = fsdp2.FSDP2Engine(spec)
        loss = engine.forward_backward(batch, token_mean_loss, temperature=1.0)["loss"]
        norm = engine.optimizer_step(lr=1e-3)
        params = {n: t.clone() for n, t in engine.named_parameters_for_sync()}
        # the same loss on the batch with zero-advantage rows, all rows kept, fresh weights
        fresh = fsdp2.FSDP2Engine(spec)
        fresh.forward_backward(zero_advantage_batch(), token_mean_loss, temperature=1.0)
        skip_norm = fresh.optimizer_step(lr=1e-3)
    finally:
        dist.destroy_process_group()
    return {
        "logits": hf_logits(model_path, batch),
        "loss": loss,
        "grad_norm": norm,
        "params": params,
        "skip_grad_norm": skip_norm,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    tmp = tmp_path_factory.mktemp("megatron_dist")
    models = {
        "untied": str(build_tiny_model(tmp / "untied")),
        "tied": str(build_tiny_model(tmp / "tied", tie_word_embeddings=True)),
    }
    scenarios = [f"{n}:{tp}:{pp}:{models[m]}" for n, (tp, pp, m) in SCENARIOS.items()]
    with Ranks([sys.executable, str(WORKER), str(tmp), *scenarios]) as ranks:
        references = {name: _fsdp2_reference(path) for name, path in models.items()}
        ranks.wait(timeout=400)
    results = {name: torch.load(tmp / f"{name}.pt", weights_only=True) for name in SCENARIOS}
    for name in SCENARIOS:
        results[name]["checkpoint"] = tmp / f"{name}_checkpoint"
        results[name]["model_path"] = models[SCENARIOS[name][2]]
    return results, references


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_logits_equal_transformers(runs, scenario):
    results, references = runs
    got = results[scenario]
    batch = make_batch()
    expected = references[SCENARIOS[scenario][2]]["logits"]
    rows = got["logits"].shape[0]  # DP=2: rank 0 holds the first half of the rows
    mask = batch.batch["attention_mask"][:rows]
    assert valid_max_diff(got["logits"], expected[:rows], mask) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_one_step_equals_fsdp2(runs, scenario):
    results, references = runs
    got, ref = results[scenario], references[SCENARIOS[scenario][2]]
    assert set(got["params"]) == set(ref["params"])
    if scenario != "dp2":  # with DP, the loss metric is rank 0's half
        assert float(got["loss"]) == pytest.approx(ref["loss"], abs=1e-6)
    assert float(got["grad_norm"]) == pytest.approx(ref["grad_norm"], rel=1e-5)
    diff = max(float((got["params"][n] - p).abs().max()) for n, p in ref["params"].items())
    # One Adam step: a gradient element near zero is normalised to about +-lr, so float32
    # reduction-order differences between the TP/PP split and FSDP2 show up at ~1e-5 in the
    # parameters (1.09e-5 and 1.34e-5 measured for tp2 and pp2 on the CI machine's kernels).
    assert diff < 2e-5


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["tp2", "dp2"])
def test_zero_advantage_rows_left_out_give_the_full_gradient(runs, scenario):
    """The role trainer's skip lever: totals count each row once per data-parallel group."""
    results, references = runs
    got, ref = results[scenario], references[SCENARIOS[scenario][2]]
    assert float(got["skip_grad_norm"]) == pytest.approx(ref["skip_grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_dispatch_info_marks_one_collect_rank_per_data_parallel_group(runs):
    results, _ = runs
    # rows: (dp_rank, dp_size, is_collect) of global ranks 0 and 1
    assert results["tp2"]["dispatch"].tolist() == [[0, 1, 1], [0, 1, 0]]  # TP rank 0 collects
    assert results["pp2"]["dispatch"].tolist() == [[0, 1, 0], [0, 1, 1]]  # the last stage does
    assert results["dp2"]["dispatch"].tolist() == [[0, 2, 1], [1, 2, 1]]


@pytest.mark.slow
def test_different_rows_on_tensor_parallel_ranks_fail_loudly(runs):
    results, _ = runs
    assert "received different rows" in results["tp2"]["mismatch_error"]
    assert "MESH_COMPUTE_PROTO" in results["tp2"]["mismatch_error"]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_one_process_reads_the_weights_of_any_layout(runs, scenario):
    """What ``rlcore export`` does: an inference-only engine on one process, unsharded,
    merges the TP/PP checkpoint shards; its weights are exactly the trained ones."""
    from megatron.core import parallel_state

    from rlcore.interfaces import EngineSpec
    from rlcore_megatron.engine import MegatronEngine

    results, _ = runs
    got = results[scenario]
    tp, pp, _ = SCENARIOS[scenario]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        spec = EngineSpec(
            role="actor", model_path=got["model_path"], optim=None, micro_batch_size=2
        )
        engine = MegatronEngine(
            spec, MegatronEngine.Config(tensor_parallel=tp, pipeline_parallel=pp)
        )
        assert (engine.layout.tp, engine.layout.pp) == (1, 1)
        engine.load_checkpoint(str(got["checkpoint"]))
        loaded = dict(engine.named_parameters_for_sync())
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    assert set(loaded) == set(got["params"])
    assert all(torch.equal(loaded[n], got["params"][n]) for n in loaded)
