"""HFRollout on a tiny Qwen2: layout, EOS handling, padding, seeding, sampling knobs."""

from __future__ import annotations

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.testing.prompts import prompt_batch
from rlcore_hf.rollout import HFRollout, WeightSyncError

torch.set_num_threads(1)

R = 8  # max_new_tokens in these tests


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("hf_rollout") / "model", hidden=64, heads=2, kv_heads=1
        )
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def rollout(tiny_path):
    return HFRollout(RolloutSpec(model_path=tiny_path, seed=7))


prompts = prompt_batch


GREEDY = SamplingParams(do_sample=False, max_new_tokens=R)


def test_one_response_per_row(rollout, tokenizer):
    batch = prompts(tokenizer, ["Hi", "What is 2+3?", "abc"])
    rows = batch.repeat(3, interleave=True)  # the driver's expansion, n = 3
    out = rollout.generate(rows, SamplingParams(max_new_tokens=R, temperature=1.0))
    b = out.batch
    p = batch.batch["input_ids"].shape[1]
    assert len(out) == 9
    assert b["responses"].shape == b["response_mask"].shape == (9, R)
    assert (
        b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (9, p + R)
    )
    # Prompt i's samples are rows 3i .. 3i+2.
    torch.testing.assert_close(b["prompts"], batch.batch["input_ids"].repeat_interleave(3, dim=0))
    torch.testing.assert_close(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    # Left padding: prompt positions from the mask, response positions continue them.
    prompt_mask = b["attention_mask"][:, :p]
    torch.testing.assert_close(b["position_ids"][:, :p], (prompt_mask.cumsum(-1) - 1).clamp(min=0))
    last = b["position_ids"][:, p - 1 : p]
    torch.testing.assert_close(b["position_ids"][:, p:], last + torch.arange(1, R + 1))
    torch.testing.assert_close(b["attention_mask"][:, p:], b["response_mask"])
    # Sampling at T=1 over 259 tokens: the 3 samples of a prompt differ.
    assert not torch.equal(b["responses"][0], b["responses"][1])


def test_greedy_is_deterministic_and_padding_invariant(rollout, tokenizer):
    alone = rollout.generate(prompts(tokenizer, ["abc"]), GREEDY).batch["responses"]
    again = rollout.generate(prompts(tokenizer, ["abc"]), GREEDY).batch["responses"]
    # The same prompt left-padded next to a longer one generates the same tokens.
    padded = rollout.generate(prompts(tokenizer, ["a much longer prompt", "abc"]), GREEDY)
    torch.testing.assert_close(alone, again, rtol=0, atol=0)
    torch.testing.assert_close(padded.batch["responses"][1:], alone, rtol=0, atol=0)


def test_seeded_sampling_reproduces(tiny_path, tokenizer):
    batch = prompts(tokenizer, ["Hello", "x"])
    batch = batch.repeat(2, interleave=True)
    sampling = SamplingParams(max_new_tokens=R)
    a, b = (HFRollout(RolloutSpec(model_path=tiny_path, seed=3)) for _ in range(2))
    first_a, first_b = a.generate(batch, sampling), b.generate(batch, sampling)
    torch.testing.assert_close(
        first_a.batch["responses"], first_b.batch["responses"], rtol=0, atol=0
    )
    # The per-call counter moves the seed: a second call samples something else.
    second_a = a.generate(batch, sampling)
    assert not torch.equal(first_a.batch["responses"], second_a.batch["responses"])


def test_top_k_one_and_tiny_top_p_are_greedy(rollout, tokenizer):
    batch = prompts(tokenizer, ["Hello there", "42"])
    greedy = rollout.generate(batch, GREEDY).batch["responses"]
    top_k = rollout.generate(batch, SamplingParams(max_new_tokens=R, top_k=1, temperature=1.5))
    top_p = rollout.generate(batch, SamplingParams(max_new_tokens=R, top_p=1e-6, temperature=1.5))
    torch.testing.assert_close(top_k.batch["responses"], greedy, rtol=0, atol=0)
    torch.testing.assert_close(top_p.batch["responses"], greedy, rtol=0, atol=0)


def test_stops_at_eos_and_masks_after_it(tiny_path, tokenizer, tmp_path):
    from transformers import GenerationConfig

    batch = prompts(tokenizer, ["abc"])
    base = HFRollout(RolloutSpec(model_path=tiny_path))
    greedy = base.generate(batch, GREEDY).batch["responses"][0]
    # Declare the 3rd greedy token an extra EOS (models often have several EOS ids); the
    # first position where it appears is where generation must stop.
    stop = int(greedy[2])
    k = int((greedy == stop).nonzero()[0])
    folder = tmp_path / "model"
    import shutil

    shutil.copytree(tiny_path, folder)
    GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, stop], pad_token_id=0, bos_token_id=0
    ).save_pretrained(folder)
    rollout = HFRollout(RolloutSpec(model_path=str(folder)))
    out = rollout.generate(batch, GREEDY).batch
    resp, mask = out["responses"][0], out["response_mask"][0]
    torch.testing.assert_close(resp[: k + 1], greedy[: k + 1], rtol=0, atol=0)
    assert resp[k] == stop
    assert mask.tolist() == [1] * (k + 1) + [0] * (R - k - 1)  # EOS itself is kept
    assert (resp[k + 1 :] == rollout.pad_token_id).all()


def test_rollout_log_probs_are_those_of_the_samples(rollout, tokenizer):
    batch = prompts(tokenizer, ["ab", "hello"]).repeat(2, interleave=True)
    out = rollout.generate(
        batch, SamplingParams(max_new_tokens=R, temperature=0.8, return_log_probs=True)
    )
    b = out.batch
    with torch.no_grad():
        logits = rollout.model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits
    logp = torch.log_softmax(logits[:, -R - 1 : -1].float() / 0.8, -1)
    expected = logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]
    torch.testing.assert_close(b["rollout_log_probs"], expected, atol=1e-4, rtol=0)


def test_update_weights_rejects_unknown_names_and_shapes(rollout):
    with pytest.raises(WeightSyncError, match="does not have"):
        rollout.update_weights([("model.nope.weight", torch.zeros(1))])
    with pytest.raises(WeightSyncError, match="expects"):
        rollout.update_weights([("lm_head.weight", torch.zeros(3, 3))])


def test_generate_one_default_matches_generate(rollout, tokenizer):
    import asyncio

    batch = prompts(tokenizer, ["abc"])
    full = rollout.generate(batch, GREEDY).batch
    ids = [int(t) for t in batch.batch["input_ids"][0]]
    result = asyncio.run(rollout.generate_one(ids, GREEDY))
    length = int(full["response_mask"][0].sum())
    assert result.token_ids == full["responses"][0, :length].tolist()
    assert result.finish_reason == ("length" if length == R else "stop")
    assert result.log_probs is None


def test_plugin_module_imports_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys, rlcore_hf.plugin as p; "
        "assert p.register_rollouts() == {'hf': 'rlcore_hf.rollout:HFRollout'}; "
        "heavy = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_max_batch_size_splits_generate_calls_without_changing_results(tiny_path, tokenizer):
    batch = prompts(tokenizer, ["one", "two two", "three three three"])
    whole = HFRollout(RolloutSpec(model_path=tiny_path))
    split = HFRollout(RolloutSpec(model_path=tiny_path), HFRollout.Config(max_batch_size=1))
    batch = batch.repeat(2, interleave=True)
    sampling = SamplingParams(do_sample=False, max_new_tokens=R)
    a, b = whole.generate(batch, sampling).batch, split.generate(batch, sampling).batch
    for key in ("responses", "response_mask", "input_ids", "position_ids"):
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
