"""FSDP2Engine in one process (a private 1-rank gloo group): numerics, batching, state."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlcore.engine import local_device_index, split_micro_batches
from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.protocol import DataProto
from rlcore_fsdp2.batching import trim_left_padding
from rlcore_fsdp2.compiled import bucket, bucket_count, pad_to_bucket, padded_outputs, shape_bound
from rlcore_fsdp2.engine import FSDP2Engine, FSDP2Error
from rlcore_fsdp2.forward import Scoring

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(
        build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=64, heads=2, kv_heads=1)
    )


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    """The engine creates a 1-rank group on first use; leave the test process as found."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def make_batch(rows: int = 8, prompt: int = 6, response: int = 5, seed: int = 0) -> DataProto:
    """Left-padded prompts of varied length, right-padded responses with some masked tails."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones(rows, prompt + response, dtype=torch.long)
    resp_mask = torch.ones(rows, response, dtype=torch.long)
    for i in range(rows):
        attn[i, : i % prompt] = 0  # left padding 0..prompt-1
        cut = response - (i % 3)  # 0-2 masked response tokens at the end
        resp_mask[i, cut:] = 0
        attn[i, prompt + cut :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": ids[:, prompt:],
            "response_mask": resp_mask,
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def token_mean_loss(outputs, mb, totals):
    """Policy-gradient-shaped token-mean loss, normalised by the mini-batch's token count."""
    mask = mb.batch["response_mask"].float()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def engine(path: str, **spec_kw) -> FSDP2Engine:
    spec_kw.setdefault("optim", OptimConfig(lr=1e-3))
    return FSDP2Engine(EngineSpec(role="actor", model_path=path, **spec_kw), FSDP2Engine.Config())


def grads(e: FSDP2Engine) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in e.model.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        out[name] = g.clone()
    return out


def params(e: FSDP2Engine) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in e.named_parameters_for_sync()}


# --- pure helpers -----------------------------------------------------------------------


def test_split_micro_batches_by_count_and_budget():
    data = make_batch(rows=7)
    by_count = split_micro_batches(data, micro_batch_size=3, max_tokens=None)
    assert [len(m) for m in by_count] == [3, 3, 1]
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    budget = 2 * max(lengths)
    by_tokens = split_micro_batches(data, micro_batch_size=None, max_tokens=budget)
    assert sum(len(m) for m in by_tokens) == 7
    rows = torch.cat([m.batch["input_ids"] for m in by_tokens])
    assert torch.equal(rows, data.batch["input_ids"])  # order kept
    for m in by_tokens:
        padded = len(m) * int(m.batch["attention_mask"].sum(-1).max())
        assert padded <= budget or len(m) == 1
    # A budget smaller than any row still makes progress: one row each.
    assert len(split_micro_batches(data, micro_batch_size=None, max_tokens=1)) == 7


def test_trim_left_padding_drops_only_all_pad_columns():
    attn = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    ids = torch.arange(8).reshape(2, 4)
    i, a, _p = trim_left_padding(ids, attn, attn.cumsum(-1) - 1)
    assert i.shape == (2, 3)
    assert torch.equal(a, attn[:, 1:])
    assert torch.equal(i, ids[:, 1:])


def test_device_pick_follows_the_worker_base(tiny_path, monkeypatch):
    """Ray shows a worker one GPU: LOCAL_RANK=1 must pick device 0, not an invalid ordinal."""
    assert local_device_index(1, 1) == 0  # CUDA_VISIBLE_DEVICES narrowed to one device
    assert local_device_index(1, 2) == 1  # torchrun: every GPU visible
    assert local_device_index(3, 2) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    e = engine(tiny_path, micro_batch_size=4)  # the CPU-safe path builds with this env
    assert e.device.type == "cpu"
    assert e.compute_log_prob(make_batch(), temperature=1.0).log_probs.shape == (8, 5)


# --- numerics ---------------------------------------------------------------------------


def test_log_probs_and_entropy_match_plain_transformers(tiny_path):
    from transformers import AutoModelForCausalLM

    e = engine(tiny_path, micro_batch_size=3)
    data = make_batch()
    out = e.compute_log_prob(data, temperature=0.7, with_entropy=True)
    ref = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    b = data.batch
    with torch.no_grad():
        logits = ref(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits
    r = b["responses"].shape[1]
    logits = logits[:, -r - 1 : -1].float() / 0.7
    logp = torch.log_softmax(logits, -1)
    expected = logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert out.log_probs.shape == out.entropy.shape == (8, r)
    # Compare valid response tokens (masked ones follow padding and are never used).
    m = b["response_mask"].bool()
    torch.testing.assert_close(out.log_probs[m], expected[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.entropy[m], entropy[m], atol=1e-5, rtol=0)


def test_token_mean_gradient_independent_of_micro_batching(tiny_path):
    data = make_batch()
    e = engine(tiny_path, micro_batch_size=1)
    reference = None
    for mbs in (1, 2, 4, 8):
        e.spec = attrs.evolve(e.spec, micro_batch_size=mbs)
        e.forward_backward(data, token_mean_loss, temperature=1.0)
        g = grads(e)
        e.optimizer.zero_grad(set_to_none=True)
        if reference is None:
            reference = g
            continue
        for name in reference:
            torch.testing.assert_close(g[name], reference[name], atol=1e-6, rtol=1e-5, msg=name)
    # Dynamic batching (token budget) gives the same gradient too.
    lengths = data.batch["attention_mask"].sum(-1)
    dyn = engine(
        tiny_path, micro_batch_size=None, max_tokens_per_micro_batch=int(2 * lengths.max())
    )
    dyn.forward_backward(make_batch(), token_mean_loss, temperature=1.0)
    g = grads(dyn)
    for name in reference:
        torch.testing.assert_close(g[name], reference[name], atol=1e-6, rtol=1e-5, msg=name)


def test_optimizer_step_clips_and_skips_non_finite(tiny_path):
    e = engine(tiny_path, micro_batch_size=4, grad_clip=1e-3)
    data = make_batch()
    before = params(e)
    e.forward_backward(data, token_mean_loss, temperature=1.0)
    norm = e.optimizer_step(lr=1e-3)
    assert math.isfinite(norm)
    assert norm > 1e-3
    assert e.global_step == 1
    assert e.lr == pytest.approx(1e-3)
    after = params(e)
    assert any(not torch.equal(before[n], after[n]) for n in before)

    e.forward_backward(data, token_mean_loss, temperature=1.0)
    next(iter(e.model.parameters())).grad.fill_(float("nan"))
    norm = e.optimizer_step(lr=1e-3)
    assert math.isnan(norm)
    assert e.skipped_steps == 1
    assert e.global_step == 1
    for n, t in params(e).items():
        assert torch.equal(t, after[n]), n  # the update was skipped
    assert all(p.grad is None for p in e.model.parameters())


def test_reference_engine_has_no_optimizer(tiny_path):
    ref = FSDP2Engine(EngineSpec(role="ref", model_path=tiny_path), FSDP2Engine.Config())
    assert ref.compute_log_prob(make_batch(), temperature=1.0).log_probs.shape == (8, 5)
    with pytest.raises(FSDP2Error, match="no optimizer"):
        ref.forward_backward(make_batch(), token_mean_loss, temperature=1.0)


def test_critic_value_head_trains(tiny_path):
    spec = EngineSpec(
        role="critic",
        model_path=tiny_path,
        value_head=True,
        optim=OptimConfig(lr=1e-2),
        micro_batch_size=4,
    )
    critic = FSDP2Engine(spec, FSDP2Engine.Config())
    data = make_batch()
    values = critic.compute_values(data)
    assert values.shape == (8, 5)
    assert values.dtype == torch.float32

    def value_loss(outputs, mb, totals):
        mask = mb.batch["response_mask"].float()
        loss = ((outputs.values - 1.0) ** 2 * mask).sum() / totals.tokens
        return loss, {"critic/vf_loss": float(loss.detach())}

    first = critic.forward_backward(data, value_loss, temperature=1.0)["critic/vf_loss"]
    critic.optimizer_step(lr=1e-3)
    for _ in range(3):
        critic.forward_backward(data, value_loss, temperature=1.0)
        critic.optimizer_step(lr=1e-3)
    assert critic.forward_backward(data, value_loss, temperature=1.0)["critic/vf_loss"] < first
    with pytest.raises(FSDP2Error, match="compute_values"):
        critic.compute_log_prob(data, temperature=1.0)


# --- state ------------------------------------------------------------------------------


def test_checkpoint_roundtrip_resumes_identically(tiny_path, tmp_path):
    data = make_batch()
    opt = OptimConfig(lr=1e-3, warmup_steps=3)
    e = engine(tiny_path, micro_batch_size=4, optim=opt, total_steps=10)
    e.forward_backward(data, token_mean_loss, temperature=1.0)
    e.optimizer_step(lr=1e-3)
    e.save_checkpoint(str(tmp_path / "ckpt"))
    e.forward_backward(data, token_mean_loss, temperature=1.0)
    e.optimizer_step(lr=2e-3)
    expected = params(e)

    fresh = engine(tiny_path, micro_batch_size=4, optim=opt, total_steps=10)
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert fresh.global_step == 1
    fresh.forward_backward(data, token_mean_loss, temperature=1.0)
    fresh.optimizer_step(lr=2e-3)
    assert fresh.lr == pytest.approx(2e-3)
    for n, t in params(fresh).items():
        torch.testing.assert_close(t, expected[n], atol=0, rtol=0, msg=n)
    with pytest.raises(FSDP2Error, match="no engine checkpoint"):
        fresh.load_checkpoint(str(tmp_path / "missing"))


def test_export_hf_loads_in_transformers(tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    e = engine(tiny_path, micro_batch_size=8, optim=OptimConfig(lr=1e-2))
    data = make_batch()
    e.forward_backward(data, token_mean_loss, temperature=1.0)
    e.optimizer_step(lr=1e-3)
    e.export_hf(str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert AutoTokenizer.from_pretrained(tmp_path / "hf").eos_token == "<|im_end|>"
    synced = params(e)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, synced[name], atol=0, rtol=0, msg=name)


def test_gradient_checkpointing_gives_the_same_gradient(tiny_path):
    data = make_batch()
    plain, ckpt = (
        engine(tiny_path, micro_batch_size=4, gradient_checkpointing=gc) for gc in (False, True)
    )
    assert ckpt.model.is_activation_checkpointing
    assert not plain.model.is_activation_checkpointing
    plain.forward_backward(data, token_mean_loss, temperature=1.0)
    ckpt.forward_backward(data, token_mean_loss, temperature=1.0)
    expected = grads(plain)
    for name, g in grads(ckpt).items():
        torch.testing.assert_close(g, expected[name], atol=1e-6, rtol=1e-5, msg=name)


def test_bf16_mixed_precision_keeps_fp32_masters(tiny_path):
    fp32 = engine(tiny_path, micro_batch_size=8)
    bf16 = engine(tiny_path, micro_batch_size=8, dtype="bfloat16")
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())  # master shards
    data = make_batch()
    lp32, lp16 = (
        fp32.compute_log_prob(data, temperature=1.0).log_probs,
        bf16.compute_log_prob(data, temperature=1.0).log_probs,
    )
    m = data.batch["response_mask"].bool()
    assert not torch.equal(lp16, lp32)  # bf16 compute really happened
    torch.testing.assert_close(lp16[m], lp32[m], atol=0.05, rtol=0)
    bf16.forward_backward(data, token_mean_loss, temperature=1.0)
    assert math.isfinite(bf16.optimizer_step(lr=1e-3))


# --- the compiled update (actor.compile) ----------------------------------------------


def test_buckets_and_their_bound():
    assert [bucket(n, 64) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    assert [bucket(n, 24) for n in (5, 17, 24)] == [16, 24, 24]
    assert bucket(70, 64) == 128  # past the cap (never from the data): the next power of two
    assert bucket_count(64) == 3  # {16, 32, 64}
    assert bucket_count(24) == 2  # {16, 24}
    assert bucket_count(160) == 5  # {16, 32, 64, 128, 160}
    spec = EngineSpec(
        role="actor", model_path="-", micro_batch_size=4, max_prompt_length=64,
        max_response_length=24,
    )  # fmt: skip
    assert shape_bound(spec) == 6  # the quickstart's: rows fixed, 3 x 2 lengths
    by_tokens = EngineSpec(
        role="actor", model_path="-", micro_batch_size=None, max_tokens_per_micro_batch=1024,
        max_prompt_length=64, max_response_length=24,
    )  # fmt: skip
    assert shape_bound(by_tokens) == 11 * 6  # rows: powers of two 1..1024


def test_bucketed_micro_batch_gives_the_eager_outputs(tiny_path):
    """Padding a micro-batch to its bucket (left, right, filler rows) changes no output."""
    e = engine(tiny_path, micro_batch_size=4, max_prompt_length=16, max_response_length=8)
    mb = make_batch().slice(0, 3)  # 3 rows, prompt 6, response 5
    padded = pad_to_bucket(mb, e.spec, e.device)
    assert padded.shape == (4, 16, 8)
    scoring = Scoring(
        value_head=False, temperature=0.7, with_entropy=True, entropy_grad=False, chunk_tokens=None
    )
    with torch.no_grad():
        got = padded_outputs(e.model, padded, scoring)
        want = e._forward(mb, temperature=0.7, with_entropy=True, entropy_grad=False)
    mask = mb.batch["response_mask"].bool()
    assert got.log_probs.shape == want.log_probs.shape == (3, 5)
    torch.testing.assert_close(got.log_probs[mask], want.log_probs[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy[mask], want.entropy[mask], atol=1e-5, rtol=0)


def test_bucketed_critic_values_and_lora_refusal(tiny_path):
    from rlcore.errors import ConfigError

    spec = EngineSpec(
        role="critic", model_path=tiny_path, value_head=True, optim=OptimConfig(lr=1e-3),
        micro_batch_size=4, max_prompt_length=16, max_response_length=8,
    )  # fmt: skip
    critic = FSDP2Engine(spec, FSDP2Engine.Config())
    mb = make_batch().slice(0, 3)
    scoring = Scoring(
        value_head=True, temperature=1.0, with_entropy=False, entropy_grad=False, chunk_tokens=None
    )
    with torch.no_grad():
        got = padded_outputs(critic.model, pad_to_bucket(mb, spec, critic.device), scoring)
        want = critic._forward(mb, temperature=1.0, with_entropy=False, entropy_grad=False)
    mask = mb.batch["response_mask"].bool()
    torch.testing.assert_close(got.values[mask], want.values[mask], atol=1e-5, rtol=0)
    lora = FSDP2Engine.Config(lora_rank=4)
    actor = EngineSpec(role="actor", model_path=tiny_path, compile=True)
    with pytest.raises(ConfigError, match=r"^actor.compile = true with actor.engine.lora_rank"):
        FSDP2Engine.preflight(actor, lora, world_size=1, where="[actor.engine]")


@pytest.mark.slow
def test_compiled_update_matches_eager_and_resumes_identically(tiny_path, tmp_path):
    """One update compiled vs eager: loss, gradients, grad norm; then a compiled
    run resumed compiled from a checkpoint matches the uninterrupted one bit for bit."""
    data = make_batch(rows=16)  # 4 micro-batches of one bucket (the first two run eager)
    kw = {"micro_batch_size": 4, "max_prompt_length": 6, "max_response_length": 5}
    opt = OptimConfig(lr=1e-3)
    eager, compiled = (
        engine(tiny_path, **kw, optim=opt),
        engine(tiny_path, **kw, optim=opt, compile=True),
    )
    want = eager.forward_backward(data, token_mean_loss, temperature=1.0)
    got = compiled.forward_backward(data, token_mean_loss, temperature=1.0)
    assert got["perf/compile_s/actor"] > 0  # the third micro-batch compiled, the fourth ran
    assert len(compiled._compiled._times[(4, 6, 5)].compiled_s) == 1  # compiled once
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    expected = grads(eager)
    for name, g in grads(compiled).items():
        torch.testing.assert_close(g, expected[name], atol=1e-6, rtol=1e-5, msg=name)
    # (Parameters after AdamW's first step are not compared: it moves each by ~lr * sign(g),
    # so a gradient entry of ~1e-9 whose sign float rounding flips differs by 2 * lr.)
    assert compiled.optimizer_step(lr=1e-3) == pytest.approx(eager.optimizer_step(lr=1e-3))

    # Resume within the compiled mode: the checkpoint holds the shapes that ran eager once.
    compiled.save_checkpoint(str(tmp_path / "ckpt"))
    compiled.forward_backward(data, token_mean_loss, temperature=1.0)
    compiled.optimizer_step(lr=1e-3)
    uninterrupted = params(compiled)
    fresh = engine(tiny_path, **kw, optim=opt, compile=True)
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert fresh._compiled.eager == compiled._compiled.eager
    fresh.forward_backward(data, token_mean_loss, temperature=1.0)
    fresh.optimizer_step(lr=1e-3)
    for name, t in params(fresh).items():
        torch.testing.assert_close(t, uninterrupted[name], atol=0, rtol=0, msg=name)


def test_plugin_module_imports_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys, rlcore_fsdp2.plugin as p; "
        "assert p.register_engines() == {'fsdp2': 'rlcore_fsdp2.engine:FSDP2Engine'}; "
        "heavy = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
