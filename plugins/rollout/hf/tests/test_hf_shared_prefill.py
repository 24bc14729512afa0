"""Generation that shares the prompt (rlcore_hf.shared_prefill): one prefill per distinct prompt.

Real model, real ``generate``: with ``share_prompt_prefill`` on, the rollout must give exactly
the tokens (greedy, and sampled with one seed) and log-probs it gives with it off, having
prefilled each distinct prompt once; an expansion that maps samples to the wrong prompt fails.
"""

from __future__ import annotations

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.testing.prompts import prompt_batch
from rlcore_hf import shared_prefill as sp
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)

TEXTS = ["What is 2+3?", "Hi", "abcdefgh 12", "Hi there, how are you?"]
N = 4


@pytest.fixture(scope="module")
def tiny_path(tiny_hf_path):
    return tiny_hf_path


@pytest.fixture(scope="module")
def rows(tiny_path) -> DataProto:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    return prompt_batch(tok, TEXTS).repeat(N, interleave=True)


def generate(tiny_path, rows, sampling, *, share, prealloc=True):
    rollout = HFRollout(
        RolloutSpec(model_path=tiny_path, seed=11),
        HFRollout.Config(share_prompt_prefill=share, preallocate_kv_cache=prealloc),
    )
    return rollout.generate(rows, sampling).batch


@pytest.mark.parametrize("prealloc", [True, False], ids=["growing-cache", "dynamic-cache"])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=16, temperature=1.0, return_log_probs=True),
        SamplingParams(do_sample=False, max_new_tokens=16, return_log_probs=True),
    ],
    ids=["sampled", "greedy"],
)
def test_same_tokens_and_log_probs_as_a_prefill_per_row(
    tiny_path, rows, sampling, prealloc, monkeypatch
):
    records = []
    real = sp.shared_prefill

    def recording(*args, **kwargs):
        ctx = real(*args, **kwargs)
        return _Recorder(ctx, records)

    monkeypatch.setattr(sp, "shared_prefill", recording)
    # Unset (the default): on, since the rollout runs on CPU.
    shared = generate(tiny_path, rows, sampling, share=None, prealloc=prealloc)
    assert [(r.rows, r.prompts) for r in records] == [(len(TEXTS) * N, len(TEXTS))]
    own = generate(tiny_path, rows, sampling, share=False, prealloc=prealloc)
    assert len(records) == 1  # off: never entered
    assert torch.equal(shared["responses"], own["responses"])
    assert torch.equal(shared["response_mask"], own["response_mask"])
    assert int(own["response_mask"].sum()) > 2 * len(rows)  # responses of several tokens
    torch.testing.assert_close(
        shared["rollout_log_probs"], own["rollout_log_probs"], rtol=0, atol=1e-6
    )


class _Recorder:
    def __init__(self, ctx, records):
        self.ctx, self.records = ctx, records

    def __enter__(self):
        record = self.ctx.__enter__()
        if record is not None:
            self.records.append(record)
        return record

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)


def test_a_wrong_expansion_changes_the_tokens(tiny_path, rows, monkeypatch):
    """The check above can fail: map each sample to the next prompt and greedy tokens move."""
    greedy = SamplingParams(do_sample=False, max_new_tokens=16)
    right = generate(tiny_path, rows, greedy, share=True)["responses"]
    real = sp.prompt_groups

    def shifted(ids, mask):
        firsts, owner = real(ids, mask)
        return firsts, (owner + 1) % len(firsts)

    monkeypatch.setattr(sp, "prompt_groups", shifted)
    wrong = generate(tiny_path, rows, greedy, share=True)["responses"]
    assert not torch.equal(right, wrong)
    # Sample 0 now continues prompt 1's prefill: its first token is prompt 1's greedy token.
    assert torch.equal(wrong[:N, 0], right[N : 2 * N, 0])


def test_prompt_groups():
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 5, 6], [7, 5, 6], [7, 5, 6], [0, 5, 6]])
    mask = torch.tensor([[0, 1, 1]] * 2 + [[1, 1, 1]] * 4)
    firsts, owner = sp.prompt_groups(ids, mask)
    assert firsts.tolist() == [0, 2, 5]  # the last row repeats row 0 but not adjacently
    assert owner.tolist() == [0, 0, 1, 1, 1, 2]
    # Same ids, different mask: different prompts. No repeat at all: None.
    assert sp.prompt_groups(ids[:2], torch.tensor([[0, 1, 1], [1, 1, 1]])) is None
    assert sp.prompt_groups(ids[1:3], mask[1:3]) is None
