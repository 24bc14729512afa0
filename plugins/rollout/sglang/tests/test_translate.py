"""Translation between rlcore's batch and SGLang's requests/outputs, on CPU, no SGLang.

``sglang_output`` builds outputs of exactly the shape SGLang 0.5.23's ``Engine.generate``
returns, field by field from SGLang's source (paths under ``python/sglang/srt/`` of the 0.5.23
wheel): the dict is ``managers/tokenizer_manager.py:2665-2670`` (``text``, ``output_ids``,
``meta_info``), ``meta_info`` starts at ``:2507-2513`` (``id``, ``finish_reason``,
``prompt_tokens``, ``weight_version``, ``num_retractions``), gains ``reasoning_tokens``,
``completion_tokens``, ``cached_tokens`` at ``:2552-2559`` and, with ``return_logprob``,
``input_token_logprobs``/``output_token_logprobs``/``output_token_logprobs_length`` at
``:2868-2870``, each entry a ``(logprob, token_id, text-or-None)`` tuple (``:3105-3108``; the
text is None when ``return_text_in_logprobs`` is off, its default). ``finish_reason`` is
``to_json()`` of ``managers/schedule_batch.py:284`` (stop on a token), ``:320`` (length),
``:332`` (abort). A stop on EOS keeps the EOS in ``output_ids`` (``output_ids_through_stop``,
``schedule_batch.py:1509``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlcore.interfaces import SamplingParams
from rlcore_sglang.translate import (
    Completion,
    SGLangOutputError,
    batch_tensors,
    bucket_named_tensors,
    completion_from_output,
    finish_reason_of,
    prompt_token_lists,
    request_seed,
    sampling_params_dict,
)

EOS, PAD = 2, 0


def sglang_output(
    output_ids: list[int],
    *,
    finish: str,
    prompt_tokens: int = 5,
    log_probs: list[float] | None = None,
    rid: str = "0a1b2c",
) -> dict[str, Any]:
    """One non-streaming output dict; ``finish`` is "stop", "length" or "abort"."""
    if finish == "stop":
        reason: dict[str, Any] = {"type": "stop", "matched": output_ids[-1]}
    elif finish == "length":
        reason = {"type": "length", "length": len(output_ids)}
    else:
        reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
    }
    if log_probs is not None:
        # With logprob_start_len = -1 (the default) the prompt contributes one entry, whose
        # log-prob is None (nothing predicts the first token).
        meta["input_token_logprobs"] = [(None, 1, None)]
        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(log_probs, output_ids)]
        meta["output_token_logprobs_length"] = len(output_ids)
    return {"text": "<decoded text>", "output_ids": list(output_ids), "meta_info": meta}


# --- requests -----------------------------------------------------------------------------


def test_prompt_token_lists_drop_left_padding_by_mask_not_pad_id():
    # Row 1's real prompt starts with a token equal to the pad id: only the mask tells.
    ids = torch.tensor([[PAD, PAD, 5, 6], [PAD, PAD, PAD, 7], [PAD, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]])
    assert prompt_token_lists(ids, mask) == [[5, 6], [PAD, 7], [8, 9, 10]]


def test_prompt_token_lists_refuse_an_empty_row_and_bad_shapes():
    with pytest.raises(ValueError, match="row 1 has no tokens"):
        prompt_token_lists(torch.tensor([[1, 2], [0, 0]]), torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match=r"must both be \(B, P\)"):
        prompt_token_lists(torch.tensor([1, 2]), torch.tensor([1, 1]))


def test_sampled_params_carry_every_knob():
    s = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=16)
    params = sampling_params_dict(s, stop_token_ids=[EOS, 151643, EOS])
    assert params == {
        "max_new_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "min_new_tokens": 0,
        "stop_token_ids": [EOS, 151643],
        "ignore_eos": False,
        "n": 1,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(do_sample=False, temperature=1.0, top_p=0.5, top_k=3),
        SamplingParams(temperature=0.0, top_p=0.5, top_k=3),
    ],
)
def test_greedy_is_temperature_zero_with_filters_off(sampling):
    # SGLang turns temperature < 1e-6 into top_k=1 (sampling_params.py:245) and reports
    # log_softmax of the unscaled logits for it (sampler.py:221), as the HF rollout does.
    params = sampling_params_dict(sampling, stop_token_ids=[EOS])
    assert (params["temperature"], params["top_p"], params["top_k"]) == (0.0, 1.0, -1)


@pytest.mark.parametrize(("top_k", "expected"), [(-1, -1), (0, -1), (1, 1), (50, 50)])
def test_top_k_off_is_minus_one(top_k, expected):
    # SGLang's verify() refuses 0 (sampling_params.py:263): HF's "off" must become -1.
    params = sampling_params_dict(SamplingParams(top_k=top_k), stop_token_ids=[EOS])
    assert params["top_k"] == expected


def test_seed_only_when_given():
    s = SamplingParams()
    assert "sampling_seed" not in sampling_params_dict(s, stop_token_ids=[EOS])
    assert sampling_params_dict(s, stop_token_ids=[EOS], seed=7)["sampling_seed"] == 7


def test_request_seeds_are_reproducible_distinct_and_fit_int64():
    seeds = {request_seed(base, call, row) for base in (0, 1) for call in (0, 1) for row in (0, 1)}
    assert len(seeds) == 8
    assert request_seed(3, 4, 5) == request_seed(3, 4, 5)
    assert all(0 <= s < 2**63 for s in seeds)
    assert request_seed(-1, 0, 0) >= 0  # a negative trainer seed still works


# --- outputs ------------------------------------------------------------------------------


def test_finish_reasons():
    assert finish_reason_of({"type": "stop", "matched": EOS}, 0) == "stop"
    assert finish_reason_of({"type": "stop", "matched": "</s>"}, 0) == "stop"
    assert finish_reason_of({"type": "length", "length": 4}, 0) == "length"
    with pytest.raises(SGLangOutputError, match="SGLang aborted request 3: out of memory"):
        finish_reason_of({"type": "abort", "message": "out of memory"}, 3)
    with pytest.raises(SGLangOutputError, match="unexpected finish_reason None"):
        finish_reason_of(None, 0)


def test_completion_from_output_with_log_probs():
    out = sglang_output([11, 12, EOS], finish="stop", log_probs=[-0.5, -1.25, -0.01])
    done = completion_from_output(out, row=0, max_new_tokens=4, with_log_probs=True)
    assert done == Completion(
        token_ids=[11, 12, EOS], log_probs=[-0.5, -1.25, -0.01], finish_reason="stop"
    )
    plain = completion_from_output(out, row=0, max_new_tokens=4, with_log_probs=False)
    assert plain.log_probs is None


def test_completion_errors_name_the_row_and_the_problem():
    no_lp = sglang_output([11, 12], finish="length")
    with pytest.raises(SGLangOutputError, match=r"output 2: .*return_logprob=True sent"):
        completion_from_output(no_lp, row=2, max_new_tokens=4, with_log_probs=True)
    wrong = sglang_output([11, 12], finish="length", log_probs=[-1.0, -2.0])
    wrong["meta_info"]["output_token_logprobs"][1] = (-2.0, 99, None)
    with pytest.raises(SGLangOutputError, match=r"output_token_logprobs\[1\].*token 12"):
        completion_from_output(wrong, row=0, max_new_tokens=4, with_log_probs=True)
    with pytest.raises(SGLangOutputError, match="more than max_new_tokens=2"):
        completion_from_output(
            sglang_output([1, 2, 3], finish="length"), row=0, max_new_tokens=2, with_log_probs=False
        )
    with pytest.raises(SGLangOutputError, match="aborted request 1"):
        completion_from_output(
            sglang_output([5], finish="abort"), row=1, max_new_tokens=2, with_log_probs=False
        )
    with pytest.raises(SGLangOutputError, match="expected a dict"):
        completion_from_output(["not", "a", "dict"], row=0, max_new_tokens=2, with_log_probs=False)


def _prompts():
    ids = torch.tensor([[PAD, 5, 6], [7, 8, 9]])  # (B=2, P=3), left-padded
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def test_batch_tensors_layout_matches_the_hf_rollout():
    ids, mask, pos = _prompts()
    outs = [
        sglang_output([11, EOS], finish="stop", log_probs=[-0.5, -0.25]),  # early EOS
        sglang_output([13, 14, 15, 16], finish="length", log_probs=[-1.0, -2.0, -3.0, -4.0]),
    ]
    done = [
        completion_from_output(o, row=i, max_new_tokens=4, with_log_probs=True)
        for i, o in enumerate(outs)
    ]
    t = batch_tensors(
        done,
        prompt_ids=ids,
        prompt_mask=mask,
        prompt_pos=pos,
        max_new_tokens=4,
        pad_token_id=PAD,
        eos_token_ids=[EOS],
        with_log_probs=True,
    )
    assert t["responses"].tolist() == [[11, EOS, PAD, PAD], [13, 14, 15, 16]]
    assert t["responses"].dtype == torch.long
    assert t["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]  # EOS included
    assert torch.equal(t["prompts"], ids)
    assert t["input_ids"].tolist() == [[PAD, 5, 6, 11, EOS, PAD, PAD], [7, 8, 9, 13, 14, 15, 16]]
    assert t["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]
    assert t["position_ids"].tolist() == [[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]]
    lp = t["rollout_log_probs"]
    assert lp.dtype == torch.float32
    assert lp.tolist() == [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -4.0]]


def test_pad_equal_to_eos_and_a_stop_rlcore_does_not_know():
    ids, mask, pos = _prompts()
    done = [
        # pad id == EOS id (Qwen-style tokenizers): the mask comes from the first EOS.
        Completion(token_ids=[11, EOS], log_probs=None, finish_reason="stop"),
        # SGLang stopped on a token not in rlcore's EOS list: the length still masks the pad.
        Completion(token_ids=[13, 99], log_probs=None, finish_reason="stop"),
    ]
    t = batch_tensors(
        done,
        prompt_ids=ids,
        prompt_mask=mask,
        prompt_pos=pos,
        max_new_tokens=4,
        pad_token_id=EOS,
        eos_token_ids=[EOS],
        with_log_probs=False,
    )
    assert t["responses"].tolist() == [[11, EOS, EOS, EOS], [13, 99, EOS, EOS]]
    assert t["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 0, 0]]
    assert "rollout_log_probs" not in t


def test_batch_tensors_refuse_a_lost_request():
    ids, mask, pos = _prompts()
    one = [Completion(token_ids=[1], log_probs=None, finish_reason="length")]
    with pytest.raises(SGLangOutputError, match="1 completions for 2 prompt rows"):
        batch_tensors(
            one,
            prompt_ids=ids,
            prompt_mask=mask,
            prompt_pos=pos,
            max_new_tokens=2,
            pad_token_id=PAD,
            eos_token_ids=[EOS],
            with_log_probs=False,
        )


# --- weights ------------------------------------------------------------------------------


def test_buckets_keep_order_and_size_and_send_a_big_tensor_alone():
    stream = [
        ("a", torch.zeros(4)),  # 16 bytes
        ("b", torch.zeros(4)),  # 16
        ("c", torch.zeros(20)),  # 80: larger than a bucket, travels alone
        ("d", torch.zeros(2, dtype=torch.bfloat16)),  # 4
        ("e", torch.zeros(8)),  # 32
    ]
    buckets = list(bucket_named_tensors(iter(stream), bucket_bytes=40))
    assert [[name for name, _ in b] for b in buckets] == [["a", "b"], ["c"], ["d", "e"]]
    assert [t for b in buckets for _, t in b] == [t for _, t in stream]


def test_buckets_are_lazy_and_empty_streams_give_none():
    pulled = []

    def stream():
        for i in range(4):
            pulled.append(i)
            yield f"w{i}", torch.zeros(4)

    it = bucket_named_tensors(stream(), bucket_bytes=32)
    assert [n for n, _ in next(it)] == ["w0", "w1"]
    assert pulled == [0, 1, 2]  # one tensor of look-ahead, not the whole model
    assert list(bucket_named_tensors(iter([]), bucket_bytes=8)) == []
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        list(bucket_named_tensors(iter([]), bucket_bytes=0))
