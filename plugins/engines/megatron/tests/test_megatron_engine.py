"""MegatronEngine in one process (TP = PP = DP = 1, gloo): equal to transformers and to FSDP2."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _common import hf_logits, make_batch, token_mean_loss, valid_max_diff

from rlcore.errors import ConfigError
from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore_megatron.engine import MegatronEngine, MegatronError
from rlcore_megatron.mapping import megatron_names

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    # 4 query heads in 2 groups (GQA), head_dim 32, vocabulary 259 (odd: padding is exercised)
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    """The engine creates a 1-rank group and megatron's parallel state; leave none behind."""
    yield
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def spec(path: str, **kw) -> EngineSpec:
    kw.setdefault("optim", OptimConfig(lr=1e-3))
    kw.setdefault("micro_batch_size", 2)
    return EngineSpec(role=kw.pop("role", "actor"), model_path=path, **kw)


def test_logits_equal_transformers(tiny_path):
    engine = MegatronEngine(spec(tiny_path))
    batch = make_batch()
    logits = engine.compute_logits(batch)
    expected = hf_logits(tiny_path, batch)
    assert logits.shape == expected.shape
    assert valid_max_diff(logits, expected, batch.batch["attention_mask"]) < 1e-5
    # the model holds exactly the parameters the mapping knows
    names = {n for n in engine.model.state_dict() if not n.endswith("_extra_state")}
    assert names == set(megatron_names(engine.dims))


def test_one_step_equals_fsdp2(tiny_path):
    fsdp2 = pytest.importorskip("rlcore_fsdp2.engine")
    batch = make_batch()
    # The pad token sampled as a real response token: HF's padding_idx keeps its embedding
    # row out of the gradient, and so must the megatron model.
    batch.batch["input_ids"][0, -5] = 0
    batch.batch["responses"][0, 0] = 0
    ref = fsdp2.FSDP2Engine(spec(tiny_path))
    ref_metrics = ref.forward_backward(batch, token_mean_loss, temperature=1.0)
    ref_norm = ref.optimizer_step(lr=1e-3)
    expected = {n: t.clone() for n, t in ref.named_parameters_for_sync()}

    engine = MegatronEngine(spec(tiny_path))
    metrics = engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    norm = engine.optimizer_step(lr=1e-3)
    got = {n: t.clone() for n, t in engine.named_parameters_for_sync()}
    assert set(got) == set(expected)
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], abs=1e-6)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
    initial = hf_state(tiny_path)
    moved = max(float((got[n] - initial[n]).abs().max()) for n in got)
    assert moved > 5e-4  # the step changed the weights (lr 1e-3) ...
    diff = max(float((got[n] - expected[n]).abs().max()) for n in got)
    assert diff < 1e-5  # ... exactly as FSDP2's


def hf_state(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def test_log_probs_entropy_and_temperature(tiny_path):
    engine = MegatronEngine(spec(tiny_path, optim=None, role="ref"))
    batch = make_batch()
    r = batch.batch["responses"].shape[1]
    logits = hf_logits(tiny_path, batch)[:, -(r + 1) : -1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, batch.batch["responses"][..., None])[..., 0]
    out = engine.compute_log_prob(batch, temperature=0.7, with_entropy=True)
    assert float((out.log_probs - expected).abs().max()) < 1e-5
    probs = torch.softmax(logits, -1)
    entropy = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    assert float((out.entropy - entropy).abs().max()) < 1e-5
    with pytest.raises(MegatronError, match="no optimizer"):
        engine.forward_backward(batch, token_mean_loss, temperature=1.0)


def test_non_finite_gradient_skips_the_update(tiny_path):
    engine = MegatronEngine(spec(tiny_path))
    before = {n: t.clone() for n, t in engine.named_parameters_for_sync()}

    def nan_loss(outputs, mb, totals):
        loss, metrics = token_mean_loss(outputs, mb, totals)
        return loss * float("nan"), metrics

    engine.forward_backward(make_batch(), nan_loss, temperature=1.0)
    assert math.isnan(engine.optimizer_step(lr=1e-3))
    assert engine.skipped_steps == 1
    assert engine.global_step == 0
    after = dict(engine.named_parameters_for_sync())
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(p.grad is None for p in engine.model.parameters())


def test_critic_value_head_trains_and_exports(tiny_path, tmp_path):
    from transformers import AutoModelForTokenClassification

    engine = MegatronEngine(spec(tiny_path, role="critic", value_head=True))
    batch = make_batch()
    values = engine.compute_values(batch)
    assert values.shape == batch.batch["responses"].shape

    def value_loss(outputs, mb, totals):
        mask = mb.batch["response_mask"].float()
        loss = ((outputs.values - 1.0) ** 2 * mask).sum() / totals.tokens
        return loss, {"critic/vf_loss": float(loss.detach())}

    first = engine.forward_backward(batch, value_loss, temperature=1.0)["critic/vf_loss"]
    for _ in range(5):
        engine.optimizer_step(lr=1e-3)
        last = engine.forward_backward(batch, value_loss, temperature=1.0)["critic/vf_loss"]
    assert last < first
    engine.optimizer_step(lr=1e-3)
    engine.export_hf(str(tmp_path / "critic"))
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic").eval()
    b = batch.batch
    with torch.no_grad():
        out = hf(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits[:, -6:-1, 0]
    assert float((out - engine.compute_values(batch)).abs().max()) < 1e-5


def test_export_hf_loads_in_transformers_with_equal_logits(tiny_path, tmp_path):
    engine = MegatronEngine(spec(tiny_path))
    batch = make_batch()
    engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    engine.optimizer_step(lr=1e-3)
    engine.export_hf(str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    expected = hf_logits(str(tmp_path / "hf"), batch)
    got = engine.compute_logits(batch)
    assert valid_max_diff(got, expected, batch.batch["attention_mask"]) < 1e-5


def test_checkpoint_resumes_bit_identically(tiny_path, tmp_path):
    batch = make_batch()
    engine = MegatronEngine(spec(tiny_path, optim=OptimConfig(lr=1e-3)))
    engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    engine.optimizer_step(lr=1e-3)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    engine.optimizer_step(lr=1e-3)
    expected = {n: t.clone() for n, t in engine.named_parameters_for_sync()}

    resumed = MegatronEngine(spec(tiny_path, optim=OptimConfig(lr=1e-3)))
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert resumed.global_step == 1
    resumed.forward_backward(batch, token_mean_loss, temperature=1.0)
    resumed.optimizer_step(lr=1e-3)
    got = dict(resumed.named_parameters_for_sync())
    assert all(torch.equal(got[n], expected[n]) for n in expected)
    with pytest.raises(MegatronError, match="no engine checkpoint"):
        resumed.load_checkpoint(str(tmp_path / "missing"))


def test_layout_is_validated_against_the_process_count(tiny_path):
    with pytest.raises(
        ConfigError, match=r"\[actor.engine\]: tensor_parallel \* pipeline_parallel"
    ):
        MegatronEngine(spec(tiny_path), MegatronEngine.Config(tensor_parallel=2))
    with pytest.raises(ValueError, match="pipeline_parallel must be >= 1"):
        MegatronEngine.Config(pipeline_parallel=0)
    # token budgets split micro-batches through the core's helper
    budget = MegatronEngine(spec(tiny_path, micro_batch_size=None, max_tokens_per_micro_batch=24))
    assert len(budget._micro_batches(make_batch())) > 1


def test_conformance(tiny_path):
    from rlcore.testing.conformance import check_engine

    check_engine(MegatronEngine, model_path=tiny_path, atol=1e-5)


def test_conformance_with_megatrons_distributed_optimizer(tiny_path):
    """The same contract through megatron-core's DDP grad buffers and DistributedOptimizer
    (lr applied exactly, non-finite skip, micro-batch-independent norm, checkpoints)."""
    from rlcore.testing.conformance import check_engine

    config = MegatronEngine.Config(use_distributed_optimizer=True)
    check_engine(MegatronEngine, config, model_path=tiny_path, atol=1e-5)


def test_sequence_parallel_is_refused_in_one_line_because_the_local_spec_norm_refuses_it():
    """megatron-core's local spec takes RMSNorm from LocalSpecProvider.layer_norm: torch's norm
    (WrappedTorchNorm), which asserts ``not sequence_parallel`` -- with or without apex. The
    rlcore check used to pass where apex was installed and the model build failed later."""
    from types import SimpleNamespace

    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    norm = LocalSpecProvider().layer_norm(rms_norm=True, for_qk=False)
    assert norm is WrappedTorchNorm
    config = SimpleNamespace(
        layernorm_zero_centered_gamma=False,
        persist_layer_norm=False,
        sequence_parallel=True,
        memory_efficient_layer_norm=False,
        normalization="RMSNorm",
    )
    with pytest.raises(AssertionError, match="sequence parallel not supported"):
        norm(config=config, hidden_size=8)
    for tp in (1, 2):
        with pytest.raises(ValueError, match="sequence_parallel = true is not supported") as err:
            MegatronEngine.Config(tensor_parallel=tp, sequence_parallel=True)
        assert "\n" not in str(err.value)


def test_parallel_state_outliving_its_process_group_is_rebuilt():
    """A one-process check that made and destroyed its own group leaves megatron's parallel
    state behind; the next engine must not reuse its dead groups (megatron's DDP would)."""
    from megatron.core import parallel_state as ps

    from rlcore_megatron.parallel import init_parallel

    init_parallel("cpu", tp=1, pp=1, where="[actor.engine]")
    stale = ps.get_model_parallel_group()
    dist.destroy_process_group()
    assert ps.model_parallel_is_initialized()  # what the destroyed group left behind
    init_parallel("cpu", tp=1, pp=1, where="[actor.engine]")
    assert ps.get_model_parallel_group() is not stale
    assert dist.get_process_group_ranks(ps.get_model_parallel_group()) == [0]
