"""Padding-free micro-batches (``use_remove_padding``): the same numbers as the padded path.

Every test runs the real engine twice on the same weights, padded and packed, and compares
what the update sees: log-probs, entropy and values on valid tokens, and the gradients of a
loss that uses log-probs and entropy (float32, tolerance 1e-6).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlcore.config.convert import structure
from rlcore.engine import split_micro_batches
from rlcore.errors import ConfigError
from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.protocol import DataProto
from rlcore_fsdp2.engine import FSDP2Engine
from rlcore_fsdp2.packing import VARLEN_SDPA, pack

torch.set_num_threads(1)

TOL = 1e-6
PROMPT, RESPONSE = 24, 16


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(
        build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden=64, heads=2, kv_heads=1)
    )


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def make_batch(rows: int = 8, seed: int = 0) -> DataProto:
    """Prompts of 1..24 tokens (left-padded), responses of 1..16 (right-padded), mixed."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (rows, PROMPT + RESPONSE), generator=g)
    prompt_lens = [1, 24, 5, 17, 2, 24, 9, 13][:rows]
    response_lens = [16, 1, 9, 3, 16, 12, 1, 6][:rows]
    return padded_rows(ids, prompt_lens, response_lens, g)


def padded_rows(
    ids: torch.Tensor, prompt_lens: list[int], response_lens: list[int], g: torch.Generator
) -> DataProto:
    """(rows, PROMPT + RESPONSE) ``ids`` masked to the given prompt and response lengths."""
    rows = ids.shape[0]
    attn = torch.ones(rows, PROMPT + RESPONSE, dtype=torch.long)
    resp_mask = torch.ones(rows, RESPONSE, dtype=torch.long)
    for i in range(rows):
        attn[i, : PROMPT - prompt_lens[i]] = 0
        resp_mask[i, response_lens[i] :] = 0
        attn[i, PROMPT + response_lens[i] :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT:],
            "response_mask": resp_mask,
            "advantages": torch.randn(rows, RESPONSE, generator=g),
        }
    )


def pg_entropy_loss(outputs, mb, totals):
    """Token-mean policy gradient minus an entropy bonus: gradients through both outputs."""
    mask = mb.batch["response_mask"].float()
    pg = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    loss = pg - 0.1 * (outputs.entropy * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def value_loss(outputs, mb, totals):
    mask = mb.batch["response_mask"].float()
    loss = ((outputs.values - mb.batch["advantages"]) ** 2 * mask).sum() / totals.tokens
    return loss, {"vf_loss": float(loss.detach())}


def engine(path: str, packed: bool, *, role: str = "actor", config=None, **spec_kw):
    spec_kw.setdefault("optim", OptimConfig(lr=1e-3) if role != "ref" else None)
    spec_kw.setdefault("micro_batch_size", 3)
    spec = EngineSpec(role=role, model_path=path, **spec_kw)
    return FSDP2Engine(spec, FSDP2Engine.Config(use_remove_padding=packed, **(config or {})))


def grads(e: FSDP2Engine) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in e.model.named_parameters():
        if p.grad is not None:
            out[name] = (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
    return out


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def masked_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


# --- the layout ---------------------------------------------------------------------------


def test_pack_layout_and_unpack():
    data = make_batch(rows=3)
    b = data.batch
    packed = pack(b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"])
    lengths = [1 + 16, 24 + 1, 5 + 9]
    assert packed.cu_seq_lens.tolist() == [0, 17, 42, 56]
    assert packed.max_length == max(lengths)
    assert packed.input_ids.shape == (1, sum(lengths))
    # Positions restart at 0 on every row.
    assert packed.position_ids[0, packed.cu_seq_lens[:-1].long()].tolist() == [0, 0, 0]
    # Row 1's first response token is predicted by its last prompt token (packed index 17+23).
    row1 = (packed.response_index // RESPONSE == 1).nonzero().squeeze(-1)
    assert packed.logit_index[row1].tolist() == [17 + 23]
    assert packed.labels.tolist() == b["responses"][b["response_mask"].bool()].tolist()
    flat = packed.input_ids[0, packed.logit_index + 1]  # the token after each predictor
    assert torch.equal(flat, packed.labels)
    unpacked = packed.unpack(packed.labels.float()).long()
    assert torch.equal(unpacked, b["responses"] * b["response_mask"])


def test_token_budget_counts_valid_tokens_when_packed():
    data = make_batch()
    lengths = data.batch["attention_mask"].sum(-1).tolist()  # 17, 25, 14, 20, 18, 36, 10, 19
    by_sum = split_micro_batches(data, micro_batch_size=None, max_tokens=60, packed=True)
    assert [len(m) for m in by_sum] == [3, 2, 2, 1]
    assert all(int(mb.batch["attention_mask"].sum()) <= 60 for mb in by_sum)
    assert sum(lengths) == sum(int(m.batch["attention_mask"].sum()) for m in by_sum)
    # Padded, the first three rows cost 3 x 25 = 75 > 60 tokens.
    padded = split_micro_batches(data, micro_batch_size=None, max_tokens=60)
    assert [len(m) for m in padded] == [2, 3, 1, 2]


# --- numerics against the padded path ----------------------------------------------------


@pytest.mark.parametrize("chunk", [1024, 5])
def test_log_probs_and_entropy_agree(tiny_path, chunk):
    data = make_batch()
    mask = data.batch["response_mask"]
    cfg = {"log_prob_chunk_tokens": chunk}
    padded = engine(tiny_path, False, config=cfg).compute_log_prob(
        data, temperature=0.7, with_entropy=True
    )
    packed_engine = engine(tiny_path, True, config=cfg)
    assert packed_engine.model.config._attn_implementation == VARLEN_SDPA
    packed = packed_engine.compute_log_prob(data, temperature=0.7, with_entropy=True)
    assert packed.log_probs.shape == padded.log_probs.shape == mask.shape
    assert masked_diff(packed.log_probs, padded.log_probs, mask) <= TOL
    assert masked_diff(packed.entropy, padded.entropy, mask) <= TOL
    # Padding positions carry 0 (nothing was predicted there).
    assert float(packed.log_probs[mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize(
    "spec_kw",
    [
        {"micro_batch_size": 3},
        {"micro_batch_size": None, "max_tokens_per_micro_batch": 60},
        {"micro_batch_size": 8, "gradient_checkpointing": True},
    ],
    ids=["by-count", "token-budget", "checkpointing"],
)
def test_loss_and_gradients_agree(tiny_path, spec_kw):
    data = make_batch()
    runs = {}
    for packed in (False, True):
        e = engine(tiny_path, packed, **spec_kw)
        parts: list[float] = []  # micro-batch losses sum to the mini-batch's (global totals)

        def summed(outputs, mb, totals, parts=parts):
            loss, metrics = pg_entropy_loss(outputs, mb, totals)
            parts.append(float(loss.detach()))
            return loss, metrics

        e.forward_backward(data, summed, temperature=0.9, with_entropy=True)
        runs[packed] = (sum(parts), grads(e))
    (loss_pad, g_pad), (loss_packed, g_packed) = runs[False], runs[True]
    assert max(float(g.abs().max()) for g in g_pad.values()) > 100 * TOL  # a real gradient
    assert abs(loss_packed - loss_pad) <= TOL
    assert max_diff(g_packed, g_pad) <= TOL


def test_critic_values_and_gradients_agree(tiny_path):
    data = make_batch()
    mask = data.batch["response_mask"]
    values, grad = {}, {}
    for packed in (False, True):
        e = engine(tiny_path, packed, role="critic", value_head=True)
        values[packed] = e.compute_values(data)
        e.forward_backward(data, value_loss, temperature=1.0)
        grad[packed] = grads(e)
    assert masked_diff(values[True], values[False], mask) <= TOL
    assert max_diff(grad[True], grad[False]) <= TOL


def test_reference_engine_packs_too(tiny_path):
    data = make_batch()
    mask = data.batch["response_mask"]
    padded = engine(tiny_path, False, role="ref").compute_log_prob(data, temperature=1.0)
    packed = engine(tiny_path, True, role="ref").compute_log_prob(data, temperature=1.0)
    assert masked_diff(packed.log_probs, padded.log_probs, mask) <= TOL


def test_lora_packed_agrees_with_padded(tiny_path):
    pytest.importorskip("peft", reason="LoRA needs the extra: pip install 'rlcore-fsdp2[lora]'")
    data = make_batch()
    mask = data.batch["response_mask"]
    cfg = {"lora_rank": 4, "lora_alpha": 16.0}
    runs = {}
    for packed in (False, True):
        e = engine(tiny_path, packed, config=cfg)
        e.forward_backward(data, pg_entropy_loss, temperature=1.0, with_entropy=True)
        e.optimizer_step(lr=1e-2)  # adapters move: "adapters off" now differs from "on"
        runs[packed] = (
            e.compute_log_prob(data, temperature=1.0).log_probs,
            e.compute_ref_log_prob(data, temperature=1.0).log_probs,
        )
    (on_pad, off_pad), (on_packed, off_packed) = runs[False], runs[True]
    assert masked_diff(on_pad, off_pad, mask) > 100 * TOL
    assert masked_diff(on_packed, on_pad, mask) <= TOL
    assert masked_diff(off_packed, off_pad, mask) <= TOL


def test_packing_model_still_takes_padded_inputs(tiny_path):
    """The engine's model called directly (as a rollout test does) keeps its padding mask."""
    data = make_batch()
    b = data.batch
    logits = {}
    for packed in (False, True):
        model = engine(tiny_path, packed, role="ref").model
        with torch.no_grad():
            logits[packed] = model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                position_ids=b["position_ids"],
            ).logits
    valid = b["attention_mask"].bool()
    assert float((logits[True] - logits[False])[valid].abs().max()) <= TOL


# --- configuration -------------------------------------------------------------------------


def test_use_remove_padding_is_validated(tiny_path):
    options, problems = structure(
        {"use_remove_padding": "yes"}, FSDP2Engine.Config, ("actor", "engine")
    )
    assert options is None
    assert any("use_remove_padding" in str(p) for p in problems)
    with pytest.raises(ConfigError, match=r"\[actor.engine\] use_remove_padding = true works"):
        engine(tiny_path, True, config={"attn_implementation": "flex_attention"})


# --- shared prompts (GRPO groups) ----------------------------------------------------------


def make_group_batch(seed: int = 0) -> DataProto:
    """Three prompts x 3 samples (GRPO's repeat layout), responses of mixed length.

    The third prompt's samples are split by a different prompt (row 6), so rows 5 and 7 share
    a prompt without being neighbours: they form two groups. One response is empty.
    """
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [7, 7, 7, 24, 24, 3, 11, 3, 3]
    response_lens = [16, 2, 9, 0, 13, 5, 16, 1, 8]
    prompt_of = [0, 0, 0, 1, 1, 2, 3, 2, 2]
    prompts = torch.randint(3, 250, (4, PROMPT), generator=g)
    rows = len(prompt_of)
    ids = torch.randint(3, 250, (rows, PROMPT + RESPONSE), generator=g)
    ids[:, :PROMPT] = prompts[prompt_of]
    return padded_rows(ids, prompt_lens, response_lens, g)


def test_shared_prompt_layout():
    b = make_group_batch().batch
    packed = pack(
        b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"], share_prompts=True
    )
    assert packed.prompt_groups == (
        (7, (16, 2, 9)),
        (24, (0, 13)),
        (3, (5,)),
        (11, (16,)),
        (3, (1, 8)),
    )
    # Each prompt once: 7 + 24 + 3 + 11 + 3 prompt tokens instead of 7*3 + 24*2 + 3*3 + 11.
    assert packed.input_ids.shape[1] == 48 + sum((16, 2, 9, 0, 13, 5, 16, 1, 8))
    # Every scored token is predicted by the packed token before it in its own sequence:
    # the shared prompt's last token for response token 0, the response's own before that.
    assert torch.equal(packed.labels, b["responses"][b["response_mask"].bool()])
    rows = packed.response_index // RESPONSE
    first = packed.response_index % RESPONSE == 0
    assert packed.logit_index[first & (rows == 2)].tolist() == [6]  # group 0's prompt ends at 6
    assert packed.logit_index[first & (rows == 4)].tolist() == [7 + 16 + 2 + 9 + 23]
    inner = ~first
    assert torch.equal(packed.input_ids[0, packed.logit_index[inner] + 1], packed.labels[inner])
    # Response positions continue the prompt's.
    assert packed.position_ids[0, 7 : 7 + 16].tolist() == list(range(7, 23))
    assert packed.position_ids[0, 23:25].tolist() == [7, 8]
    unpacked = packed.unpack(packed.labels.float()).long()
    assert torch.equal(unpacked, b["responses"] * b["response_mask"])


def test_distinct_prompts_pack_one_segment_per_row():
    b = make_batch().batch
    packed = pack(
        b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"], share_prompts=True
    )
    assert packed.prompt_groups is None
    assert "cu_seq_lens_q" in packed.model_kwargs()


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_shared_prompts_agree_with_a_copy_per_row(tiny_path, checkpointing):
    """Log-probs, entropy, loss and gradients: shared prompts = packed rows = padded rows."""
    data = make_group_batch()
    mask = data.batch["response_mask"]
    runs = {}
    for name, packed, share in (
        ("padded", False, False),
        ("rows", True, False),
        ("shared", True, True),
    ):
        e = engine(
            tiny_path,
            packed,
            config={"share_prompts": share},
            micro_batch_size=9,
            gradient_checkpointing=checkpointing,
        )
        assert e._share_prompts is share
        out = e.compute_log_prob(data, temperature=0.8, with_entropy=True)
        parts: list[float] = []

        def summed(outputs, mb, totals, parts=parts):
            loss, metrics = pg_entropy_loss(outputs, mb, totals)
            parts.append(float(loss.detach()))
            return loss, metrics

        e.forward_backward(data, summed, temperature=0.8, with_entropy=True)
        runs[name] = (out, sum(parts), grads(e))
    shared_out, shared_loss, shared_grads = runs["shared"]
    assert max(float(g.abs().max()) for g in shared_grads.values()) > 100 * TOL
    for name in ("padded", "rows"):
        out, loss, g = runs[name]
        assert masked_diff(shared_out.log_probs, out.log_probs, mask) <= TOL
        assert masked_diff(shared_out.entropy, out.entropy, mask) <= TOL
        assert abs(shared_loss - loss) <= TOL
        assert max_diff(shared_grads, g) <= TOL


def test_shared_prompt_critic_values_agree(tiny_path):
    data = make_group_batch()
    mask = data.batch["response_mask"]
    values = {}
    for share in (False, True):
        e = engine(tiny_path, True, role="critic", value_head=True, config={"share_prompts": share})
        values[share] = e.compute_values(data)
    assert masked_diff(values[True], values[False], mask) <= TOL


def test_token_budget_counts_a_shared_prompt_once():
    data = make_group_batch()
    # Valid tokens per row: prompt + response (7+16, 7+2, 7+9, 24+0, 24+13, 3+5, ...).
    shared = split_micro_batches(
        data, micro_batch_size=None, max_tokens=50, packed=True, share_prompts=True
    )
    # Shared: rows 0-2 run 7+16 + 2 + 9 = 34 tokens, rows 3-5 24+0 + 13 + 3+5 = 45, rows
    # 6-8 11+16 + 3+1 + 8 = 39. A prompt per row: 23+9+16 = 48, then 24, 37+8, 27+4+11.
    assert [len(m) for m in shared] == [3, 3, 3]
    rows = split_micro_batches(data, micro_batch_size=None, max_tokens=50, packed=True)
    assert [len(m) for m in rows] == [3, 1, 2, 3]
    for mb in shared:  # what each micro-batch really runs stays within the budget
        b = mb.batch
        packed = pack(
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            b["responses"],
            share_prompts=True,
        )
        assert packed.input_ids.shape[1] <= 50


def test_flex_packed_attention_matches_the_per_row_path_and_cpu_keeps_per_row():
    """The GPU path (one FlexAttention kernel, rlcore_fsdp2.flex) computes what the per-row
    path does: checked here with FlexAttention's eager reference on CPU. On CPU the engine
    never takes it: varlen_sdpa_attention stays the per-row path, bit for bit."""
    from types import SimpleNamespace

    from rlcore_fsdp2.flex import flex_ready, packed_flex_attention, per_row_attention
    from rlcore_fsdp2.packing import varlen_sdpa_attention

    gen = torch.Generator().manual_seed(0)
    bounds = [5, 17, 1, 9]
    n = sum(bounds)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(bounds).cumsum(0).tolist()], dtype=torch.int32)
    reference = per_row_attention(q, k, v, cu, None)
    flex = packed_flex_attention(q, k, v, cu, None, compiled=False)
    torch.testing.assert_close(flex, reference, rtol=0, atol=1e-5)
    assert flex_ready(torch.device("cpu")) is False
    module = SimpleNamespace(num_key_value_groups=1)
    out, _ = varlen_sdpa_attention(module, q, k, v, None, cu_seq_lens_q=cu)
    assert torch.equal(out, reference.transpose(1, 2).contiguous())


def _per_segment_shared_attention(q, k, v, groups):
    """The reference: one sdpa per prompt and per response (prompt keys, then causal)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    outs, at = [], 0
    for prompt, rows in groups:
        pk, pv = k[:, :, at : at + prompt], v[:, :, at : at + prompt]
        if prompt:
            outs.append(sdpa(q[:, :, at : at + prompt], pk, pv, is_causal=True))
        at += prompt
        for n in rows:
            if n:
                keys = torch.cat([pk, k[:, :, at : at + n]], dim=2)
                values = torch.cat([pv, v[:, :, at : at + n]], dim=2)
                seen = torch.ones(n, prompt + n, dtype=torch.bool)
                seen[:, prompt:] = torch.ones(n, n, dtype=torch.bool).tril()
                outs.append(sdpa(q[:, :, at : at + n], keys, values, attn_mask=seen))
            at += n
    return torch.cat(outs, dim=2).transpose(1, 2)


@pytest.mark.parametrize("block_tokens", [1 << 16, 40])
def test_batched_shared_prompt_attention_matches_one_call_per_segment(monkeypatch, block_tokens):
    """Outputs and input gradients equal the per-segment reference: groups of uneven
    prompts, a prompt-less group, empty responses, and (40) one block per group."""
    from rlcore_fsdp2 import shared_attention

    monkeypatch.setattr(shared_attention, "BLOCK_KEY_TOKENS", block_tokens)
    shared_attention._layout.cache_clear()
    groups = ((5, (3, 0, 7)), (0, (4, 2)), (9, (1, 6, 6, 2)), (2, (0,)))
    n = sum(p + sum(rows) for p, rows in groups)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, n, 16, generator=gen, requires_grad=True)  # 2 query heads per K/V
    k, v = (torch.randn(1, 2, n, 16, generator=gen, requires_grad=True) for _ in range(2))
    got, _ = shared_attention.shared_prompt_attention(q, k, v, groups, 0.0, None)
    want = _per_segment_shared_attention(q, k, v, groups)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    weights = torch.randn(got.shape, generator=gen)
    grads_got = torch.autograd.grad((got * weights).sum(), (q, k, v))
    grads_want = torch.autograd.grad((want * weights).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    calls = shared_attention._layout(groups, q.dtype, q.device).calls
    # one block: its prompts' call and its responses'; else a block per group (3 of the 4
    # groups have a prompt, 3 have a live response)
    assert len(calls) == (2 if block_tokens > 1000 else 6)
