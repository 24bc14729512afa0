"""The engine loop the core owns: dtype names, device set-up, the micro-batch loop, the guard.

The loop is run around a real (small) torch model's forward, the callback an engine supplies;
the gradients are compared with one pass over the whole mini-batch.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.distributed as dist

from rlcore.engine import (
    TOKENIZER_FILES,
    MetricMeans,
    OptimizerGuard,
    accumulate_gradients,
    copy_tokenizer_files,
    dtype_from_name,
    forward_micro_batches,
    init_device,
    token_weight,
)
from rlcore.errors import ConfigError, EngineError
from rlcore.interfaces import DTYPE_NAMES, EngineSpec, ModelOutputs
from rlcore.protocol import DataProto

VOCAB = 11


# --- dtypes and devices ------------------------------------------------------------------------


def test_dtype_from_name_is_torchs_dtype_of_every_config_name():
    assert DTYPE_NAMES == ("float32", "bfloat16", "float16")
    assert [dtype_from_name(n) for n in DTYPE_NAMES] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ]
    with pytest.raises(ConfigError) as err:
        dtype_from_name("fp8")
    assert str(err.value) == "unknown dtype 'fp8'; choose from float32, bfloat16, float16"


@pytest.fixture
def no_process_group():
    """init_device creates a private 1-rank group when none exists: leave none behind."""
    if dist.is_initialized():
        pytest.skip("this test process already has a process group")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_init_device_on_cpu_joins_a_private_group_seeds_and_sets_threads(
    no_process_group, monkeypatch
):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        device = init_device("cpu", seed=7, num_threads=1)
        drawn = torch.rand(3)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert device == torch.device("cpu")
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
    assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(7)))
    # A second engine in the process joins the same group; no seed: the RNG stream goes on.
    state = torch.get_rng_state()
    assert init_device("cpu") == torch.device("cpu")
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_init_device_cuda_without_a_gpu_says_what_to_set():
    with pytest.raises(ConfigError, match="device = 'cuda' but torch sees no CUDA device"):
        init_device("cuda")


# --- the micro-batch loop ----------------------------------------------------------------------


class TinyPolicy(torch.nn.Module):
    """Embedding -> linear over the vocabulary: a causal LM without attention, in float64."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, 5, generator=g, dtype=torch.float64))
        self.head = torch.nn.Parameter(torch.randn(5, VOCAB, generator=g, dtype=torch.float64))
        self.calls: list[int] = []  # rows of each forward

    def forward(self, mb: DataProto) -> ModelOutputs:
        self.calls.append(len(mb))
        ids, responses = mb.batch["input_ids"], mb.batch["responses"]
        r = responses.shape[1]
        logits = self.embed[ids] @ self.head  # (b, T, V)
        logp = torch.log_softmax(logits[:, -(r + 1) : -1], dim=-1)  # (b, R, V)
        return ModelOutputs(log_probs=logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1))


def batch(response_masks: list[list[int]], prompt: int = 3) -> DataProto:
    mask = torch.tensor(response_masks)
    rows, r = mask.shape
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (rows, prompt + r), generator=g)
    attention = torch.cat([torch.ones(rows, prompt, dtype=torch.long), mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "responses": ids[:, prompt:],
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "response_mask": mask,
            "advantages": torch.randn(rows, r, generator=g, dtype=torch.float64),
        }
    )


def pg_loss(outputs, mb, totals):
    """Token-mean policy-gradient loss over the whole mini-batch's tokens; metric ``rows``."""
    mask = mb.batch["response_mask"].double()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    padding = not bool(mask.any())
    return loss, {"loss": float(loss.detach()), "value": 99.0 if padding else 10.0}


def spec(**kw) -> EngineSpec:
    return EngineSpec(role="actor", model_path="unused", **kw)


def full_batch_grads(data: DataProto) -> list[torch.Tensor]:
    model = TinyPolicy()
    mask = data.batch["response_mask"].double()
    logp = model(data).log_probs
    (-(logp * data.batch["advantages"] * mask).sum() / mask.sum()).backward()
    return [model.embed.grad, model.head.grad]


MASKS = [[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 1]]


@pytest.mark.parametrize(
    "split",
    [
        {"micro_batch_size": 1},
        {"micro_batch_size": 2},
        {"micro_batch_size": 6},
        {"micro_batch_size": None, "max_tokens_per_micro_batch": 10},
    ],
    ids=["mbs1", "mbs2", "whole", "token-budget"],
)
def test_accumulated_gradient_is_the_mini_batch_gradient_however_split(split):
    data = batch(MASKS)
    model = TinyPolicy()
    metrics = accumulate_gradients(data, pg_loss, model, spec=spec(**split))
    for got, want in zip([model.embed.grad, model.head.grad], full_batch_grads(data), strict=True):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert sum(model.calls) == len(data)  # one rank: no zero-weight passes
    assert set(metrics) == {"loss", "value"}


def test_metrics_are_token_weighted_and_padding_micro_batches_weigh_nothing():
    data = batch([[1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    per_mb = []

    def loss_fn(outputs, mb, totals):
        loss, metrics = pg_loss(outputs, mb, totals)
        per_mb.append((metrics["loss"], int(mb.batch["response_mask"].sum())))
        return loss, metrics

    metrics = accumulate_gradients(data, loss_fn, TinyPolicy(), spec=spec(micro_batch_size=1))
    tokens = sum(t for _, t in per_mb)
    assert metrics["loss"] == pytest.approx(sum(v * t for v, t in per_mb) / tokens, rel=1e-9)
    assert metrics["value"] == pytest.approx(10.0, abs=1e-6)  # the 99s of padding: no weight
    assert token_weight(data.slice(2, 3)) == pytest.approx(0.0, abs=1e-8)
    assert token_weight(data) == 4.0


def test_loss_scale_scales_every_micro_batch_gradient():
    data = batch(MASKS)
    plain, scaled = TinyPolicy(), TinyPolicy()
    accumulate_gradients(data, pg_loss, plain, spec=spec(micro_batch_size=2))
    accumulate_gradients(data, pg_loss, scaled, spec=spec(micro_batch_size=2), loss_scale=4.0)
    assert torch.equal(scaled.head.grad, plain.head.grad * 4.0)  # x4 is exact in binary


def test_an_empty_batch_is_an_engine_error_naming_role_and_rank():
    with pytest.raises(EngineError, match=r"^\[actor\] rank 0 got an empty batch$"):
        accumulate_gradients(batch(MASKS).slice(0, 0), pg_loss, TinyPolicy(), spec=spec())


def test_forward_micro_batches_joins_outputs_without_gradient():
    data = batch(MASKS)
    model = TinyPolicy()
    out = forward_micro_batches(data, model, spec=spec(micro_batch_size=4))
    assert model.calls == [4, 2]
    assert out.log_probs is not None
    assert out.log_probs.shape == (6, 3)
    assert not out.log_probs.requires_grad
    assert out.entropy is None  # the forward filled no entropy
    with torch.no_grad():
        assert torch.equal(out.log_probs, TinyPolicy()(data).log_probs)


def test_metric_means_without_any_micro_batch_are_empty():
    means = MetricMeans()
    assert means.result() == {}
    means.add({"a": 1.0}, 1.0)
    means.add({"a": 4.0}, 3.0)
    assert means.result() == {"a": 13.0 / 4.0}


# --- the optimizer step ------------------------------------------------------------------------


def test_guard_steps_at_the_given_lr_counts_and_skips_non_finite(caplog):
    p = torch.nn.Parameter(torch.ones(3))
    guard = OptimizerGuard(torch.optim.SGD([p], lr=123.0), role="critic", max_norm=0.5)
    p.grad = torch.tensor([2.0, 0.0, 0.0])
    assert guard.step(lr=0.25) == pytest.approx(2.0)  # the norm before clipping
    # clipped to 0.5 (torch's coefficient 0.5 / (2 + 1e-6)), stepped at 0.25
    assert p.detach().tolist() == pytest.approx([0.875, 1.0, 1.0], abs=1e-6)
    after = p.detach().clone()
    assert (guard.global_step, guard.skipped_steps, guard.lr) == (1, 0, 0.25)
    assert p.grad is None

    p.grad = torch.tensor([float("inf"), 0.0, 0.0])
    with caplog.at_level(logging.WARNING, logger="rlcore.engine"):
        assert math.isinf(guard.step(lr=0.5))
    assert torch.equal(p.detach(), after)  # skipped: no update
    assert (guard.global_step, guard.skipped_steps, guard.lr) == (1, 1, 0.25)
    assert p.grad is None
    assert "[critic] grad norm is inf at step 1: update skipped" in caplog.text

    fresh = OptimizerGuard(torch.optim.SGD([p], lr=1.0), role="critic", max_norm=0.5)
    fresh.load_state_dict(guard.state_dict())
    assert (fresh.global_step, fresh.skipped_steps) == (1, 1)


def test_guard_hands_an_engine_clip_the_ceiling_or_inf():
    p = torch.nn.Parameter(torch.zeros(1))
    seen = []

    def clip(max_norm: float) -> float:
        seen.append(max_norm)
        p.grad = torch.ones(1)
        return 3.0

    OptimizerGuard(torch.optim.SGD([p], lr=1.0), role="actor", max_norm=2.0).step(lr=1.0, clip=clip)
    OptimizerGuard(torch.optim.SGD([p], lr=1.0), role="actor", max_norm=0.0).step(lr=1.0, clip=clip)
    assert seen == [2.0, math.inf]
    assert p.detach().tolist() == [-2.0]  # two steps of lr 1 on the clip's gradient


# --- export ------------------------------------------------------------------------------------


def test_copy_tokenizer_files_copies_the_named_files_the_source_has(tmp_path):
    source, out = tmp_path / "model", tmp_path / "export"
    source.mkdir()
    out.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json", "x.bin"):
        (source / name).write_text(name)
    copy_tokenizer_files(source, out)
    assert sorted(p.name for p in out.iterdir()) == ["chat_template.jinja", "tokenizer.json"]
    copy_tokenizer_files(str(source), str(out), ["generation_config.json", "missing.json"])
    assert (out / "generation_config.json").read_text() == "generation_config.json"
    assert "tokenizer.json" in TOKENIZER_FILES
