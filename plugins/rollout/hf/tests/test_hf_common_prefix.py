"""Distinct prompts with one shared head: the head is prefilled once, the outputs unchanged."""

from __future__ import annotations

import torch

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.testing.prompts import prompt_batch
from rlcore_hf import common_prefix
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)

HEAD = "System: you are a careful calculator. Reply with digits only. Question: "
QUESTIONS = ["2+2=", "what is 17 plus 25?", "9*9", "the sum of 3 and 4 is", "x"]


def test_common_prefix_length_counts_from_each_rows_first_token(tiny_hf_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_hf_path)
    batch = prompt_batch(tok, [HEAD + q for q in QUESTIONS]).batch
    ids, mask = batch["input_ids"], batch["attention_mask"]
    common_prefix_length = common_prefix.common_prefix_length
    head = len(tok(HEAD)["input_ids"])
    assert head - 2 <= common_prefix_length(ids, mask) <= head + 1  # tokenizer merges at the seam
    assert common_prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share
    holes = mask.clone()
    holes[:, -1] = 0
    assert common_prefix_length(ids, holes) == 0  # not left-padded: not touched


def test_shared_head_gives_the_same_tokens_and_log_probs(tiny_hf_path, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_hf_path)
    prompts = prompt_batch(tok, [HEAD + q for q in QUESTIONS])
    spec = RolloutSpec(model_path=tiny_hf_path)
    calls = []
    original = common_prefix.prefilled

    def spy(model, ids, mask, prefix, cache):
        calls.append(prefix)
        return original(model, ids, mask, prefix, cache)

    monkeypatch.setattr(common_prefix, "prefilled", spy)
    for sampling in (
        SamplingParams(max_new_tokens=8, do_sample=False, return_log_probs=True),
        SamplingParams(max_new_tokens=8, temperature=0.9, return_log_probs=True),
    ):
        shared = HFRollout(spec).generate(prompts, sampling)
        plain = HFRollout(spec, HFRollout.Config(share_prompt_prefill=False))
        expected = plain.generate(prompts, sampling)
        assert calls, "the shared head was not prefilled apart"
        assert calls[-1] >= common_prefix.MIN_PREFIX
        calls.clear()
        assert torch.equal(shared.batch["responses"], expected.batch["responses"])
        torch.testing.assert_close(
            shared.batch["rollout_log_probs"],
            expected.batch["rollout_log_probs"],
            atol=1e-5,
            rtol=0,
        )
        # The driver's layout is untouched: prompts and attention as given.
        assert torch.equal(shared.batch["input_ids"], expected.batch["input_ids"])
        assert torch.equal(shared.batch["attention_mask"], expected.batch["attention_mask"])
