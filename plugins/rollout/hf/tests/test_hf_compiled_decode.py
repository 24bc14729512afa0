"""``rollout.compile_decode`` (rlcore_hf.compiled_decode): a compiled decoding step in a loop of
the rollout's own gives ``generate``'s tokens.

Real model, real ``torch.compile``: greedy tokens, sampled tokens (the same random stream, both
samplers) and log-probs equal the eager rollout's on a tiny model. One compiled rollout serves
every case (a compile takes tens of seconds on a CPU: marked slow). The decoding attention is
checked against transformers' sdpa on its own, without compiling.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.testing.prompts import prompt_batch
from rlcore_hf.compile_warmup import WarmupProcess, WarmupSpec
from rlcore_hf.compiled_decode import _bucket_length, _bucket_rows, grouped_decode_attention
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)


def prompt_rows(path: str) -> DataProto:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    # Repeated prompts (the shared prefill) and distinct ones; 9 rows: padded to 16.
    return prompt_batch(tok, ["What is 2+3?", "Hi", "abcdefgh 12"]).repeat(3, interleave=True)


# Compiling in this process (no background warm-up): every call below decodes compiled.
BLOCKING = {"compile_decode": True, "compile_in_background": False}


@pytest.fixture(scope="module")
def compiled(tiny_hf_path) -> HFRollout:
    return HFRollout(RolloutSpec(model_path=tiny_hf_path, seed=5), HFRollout.Config(**BLOCKING))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sampling", "inverse_cdf"),
    [
        (SamplingParams(do_sample=False, max_new_tokens=20, return_log_probs=True), True),
        (SamplingParams(max_new_tokens=20, temperature=1.0, return_log_probs=True), True),
        (SamplingParams(max_new_tokens=20, temperature=0.8, top_k=5, top_p=0.9), False),
    ],
    ids=["greedy", "sampled", "sampled-multinomial"],
)
def test_same_tokens_as_generate(tiny_hf_path, compiled, sampling, inverse_cdf):
    rows = prompt_rows(tiny_hf_path)
    spec = RolloutSpec(model_path=tiny_hf_path, seed=5)
    eager = HFRollout(spec, HFRollout.Config(inverse_cdf_sampling=inverse_cdf))
    if not inverse_cdf:  # the same weights: reuse the compiled step (compiling costs seconds)
        decoder = compiled._decoder
        compiled = HFRollout(spec, HFRollout.Config(**BLOCKING, inverse_cdf_sampling=False))
        compiled._decoder = decoder
    compiled._calls = eager._calls = 0  # the same seed for both
    want = eager.generate(rows, sampling).batch
    got = compiled.generate(rows, sampling).batch
    assert torch.equal(got["responses"], want["responses"])
    assert torch.equal(got["response_mask"], want["response_mask"])
    assert int(want["response_mask"].sum()) > 2 * len(rows)  # responses of several tokens
    if sampling.return_log_probs:
        torch.testing.assert_close(
            got["rollout_log_probs"], want["rollout_log_probs"], rtol=0, atol=1e-5
        )
    assert compiled._decoder.graphs == 1  # every case ran on one compiled shape


def test_shapes_are_bucketed():
    assert [_bucket_rows(n) for n in (1, 8, 9, 64, 65)] == [8, 8, 16, 64, 128]
    assert [_bucket_length(n) for n in (1, 64, 65, 130)] == [64, 64, 128, 192]


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_decoding_attention_matches_sdpa(mask_kind):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, length, dim = 3, 4, 2, 7, 8
    query = torch.randn(rows, heads, 1, dim, generator=g)
    key = torch.randn(rows, kv_heads, length, dim, generator=g)
    value = torch.randn(rows, kv_heads, length, dim, generator=g)
    attend = torch.rand(rows, 1, 1, length, generator=g) > 0.3
    attend[..., 0] = True
    mask = {
        "bool": attend,
        "additive": torch.zeros(attend.shape).masked_fill(~attend, float("-inf")),
        "none": None,
    }[mask_kind]
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads  # read by transformers' repeat_kv
    module.is_causal = True
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    got, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_follows_weight_syncs(tiny_hf_path, compiled):
    """Weights streamed in (copied) or shared (the actor's storage) reach the compiled step."""
    rows = prompt_rows(tiny_hf_path)
    sampling = SamplingParams(do_sample=False, max_new_tokens=12)
    eager = HFRollout(RolloutSpec(model_path=tiny_hf_path, seed=5))
    before = compiled.generate(rows, sampling).batch["responses"]
    g = torch.Generator().manual_seed(1)
    named = {
        name: p.detach() + 0.05 * torch.randn(p.shape, generator=g)
        for name, p in eager.model.named_parameters()
    }
    for sync in ("stream", "share"):
        for rollout in (eager, compiled):
            if sync == "stream":
                rollout.update_weights(named.items())
            else:
                assert rollout.share_weights({n: t.clone() for n, t in named.items()})
        want = eager.generate(rows, sampling).batch["responses"]
        assert not torch.equal(want, before)  # the new weights change the tokens
        assert torch.equal(compiled.generate(rows, sampling).batch["responses"], want)
        named = {n: -t for n, t in named.items()}


@pytest.mark.slow
def test_background_compile_decodes_eagerly_until_ready(tiny_hf_path, compiled):
    """The default: a new shape compiles in a child process (into inductor's on-disk cache)
    while calls decode with generate; once it is done the rollout loads it and decodes
    compiled, with generate's tokens either way."""
    rows = prompt_rows(tiny_hf_path)
    sampling = SamplingParams(do_sample=False, max_new_tokens=12)
    spec = RolloutSpec(model_path=tiny_hf_path, seed=5)
    eager = HFRollout(spec)
    want = eager.generate(rows, sampling).batch["responses"]
    background = HFRollout(spec, HFRollout.Config(compile_decode=True))
    assert torch.equal(background.generate(rows, sampling).batch["responses"], want)
    decoder = background._decoder
    assert decoder.graphs == 0  # decoded eagerly
    assert len(decoder._warmups) == 1  # the child started
    deadline = time.monotonic() + 300  # a cold compile of the tiny model: ~10-30 s
    while decoder.graphs == 0:
        assert time.monotonic() < deadline, "the background compile did not finish in 300 s"
        time.sleep(0.5)
        assert torch.equal(background.generate(rows, sampling).batch["responses"], want)
    assert decoder.warmup_seconds > 0
    assert not decoder._warmups
    assert torch.equal(background.generate(rows, sampling).batch["responses"], want)
    assert decoder.graphs == 1  # one shape, compiled once


def test_failed_background_compile_says_why(tmp_path, caplog):
    """A child that cannot compile is reported with its last line; the caller then compiles
    in its own process (CompiledDecoder.ready returns True)."""
    spec = WarmupSpec(
        model_path=str(tmp_path / "no-model-here"),
        dtype="float32",
        trust_remote_code=False,
        attn_implementation="sdpa",
    )
    child = WarmupProcess(spec, rows=8, width=4, new=4, mask_dtype="int64")
    deadline = time.monotonic() + 120
    with caplog.at_level(logging.WARNING, logger="rlcore_hf.compile_warmup"):
        while (state := child.poll()) == "running":
            assert time.monotonic() < deadline, "the failing child did not exit in 120 s"
            time.sleep(0.2)
    assert state == "failed"
    (message,) = [r.getMessage() for r in caplog.records]
    assert "background compile of 8 rows x 4+4 positions failed (exit 1: " in message
    assert "no-model-here" in message  # the child's own error line
    assert message.endswith("compiling it in the rollout's process")
