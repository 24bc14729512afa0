"""Pure translation between rlcore's batch and SGLang's requests and outputs (no SGLang import).

Everything here runs on CPU without SGLang, so it is tested there against outputs of exactly the
shape SGLang 0.5.23 returns (``python/sglang/srt/...`` paths below are in that release):

- Requests: ``Engine.generate(input_ids=[[int, ...], ...], sampling_params={...} | [{...}, ...],
  return_logprob=bool)`` (``entrypoints/engine.py:433``; the same arguments as
  ``managers/io_struct.py:177`` ``GenerateReqInput``). A batch returns a list of dicts in input
  order (``managers/tokenizer_manager.py:2197`` ``_collect_batch_responses``: ``asyncio.gather``).
- Sampling keys are those of ``sampling/sampling_params.py:140`` ``SamplingParams``:
  ``temperature`` below 1e-6 means greedy (``:245`` turns it into ``top_k = 1``), ``top_k = -1``
  is off (``:249``; 0 is refused by ``verify`` at ``:263``), ``stop_token_ids`` (``:153``),
  ``sampling_seed`` (``:179``, honoured only with ``enable_deterministic_inference``,
  ``sampling/sampling_batch_info.py:157-170``).
- One output (``managers/tokenizer_manager.py:2665-2670``, non-streaming, tokenizer on)::

      {"text": str, "output_ids": [int, ...],
       "meta_info": {"id": str, "finish_reason": {...}, "prompt_tokens": int,
                     "completion_tokens": int, "cached_tokens": int, ...,
                     # only with return_logprob (tokenizer_manager.py:2868-2870):
                     "input_token_logprobs": [...],
                     "output_token_logprobs": [(logprob, token_id, text_or_None), ...],
                     "output_token_logprobs_length": int}}

  ``finish_reason`` is ``BaseFinishReason.to_json()`` (``managers/schedule_batch.py``):
  ``{"type": "stop", "matched": int | str}`` (``:284`` FINISH_MATCHED_TOKEN, ``:296``),
  ``{"type": "length", "length": int}`` (``:320``) or ``{"type": "abort", "message": ...}``
  (``:332``). ``output_ids`` include the matched stop token (``output_ids_through_stop``,
  ``schedule_batch.py:1509``, sent by ``scheduler_components/output_streamer.py:490``; only
  the *text* is trimmed, ``detokenizer_manager.py:194`` ``trim_matched_stop``).
- Log-probs (``layers/sampler.py:192-221, 271-315``): greedy rows get ``log_softmax(logits)``;
  sampled rows get ``log softmax(logits / temperature)`` of the raw logits (before top-k/top-p
  filtering) -- the same quantity the HF rollout and the training engine's ``compute_log_prob``
  at that temperature give.

The output tensors follow the HF rollout's layout exactly (see
:class:`rlcore.interfaces.BaseRollout`): responses right-padded with the pad id to exactly
``max_new_tokens``, ``response_mask`` 1 up to and including the first EOS, ``attention_mask``
= cat(prompt mask, response mask), response positions continuing from the last prompt position,
``rollout_log_probs`` float32 and 0 on padding.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs

from rlcore.engine import rollout_tensors
from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import SamplingParams

__all__ = [
    "SGLANG_VERSION",
    "Completion",
    "SGLangOutputError",
    "batch_tensors",
    "bucket_named_tensors",
    "completion_from_output",
    "finish_reason_of",
    "prompt_token_lists",
    "request_seed",
    "sampling_params_dict",
]

# The SGLang release whose source this module and rollout.py were checked against.
SGLANG_VERSION = "0.5.23"

FinishReason = Literal["stop", "length"]
T = TypeVar("T")


class SGLangOutputError(RlcoreError):
    """An SGLang output that cannot become rlcore tensors (aborted, malformed, too long)."""


@attrs.frozen(kw_only=True)
class Completion:
    """One SGLang response, translated: the fields of rlcore's ``GenerationResult``."""

    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: FinishReason


# --- requests -----------------------------------------------------------------------------


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """(B, P) left-padded ids -> B lists of the real prompt tokens.

    Padding is dropped by the attention mask, not by the pad id: the pad id may equal a real
    token (many tokenizers pad with EOS).
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        msg = (
            f"prompts: input_ids {tuple(input_ids.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must both be (B, P)"
        )
        raise ValueError(msg)
    rows = []
    for i, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
        tokens = [t for t, m in zip(ids, mask) if m]
        if not tokens:
            msg = f"prompts: row {i} has no tokens (attention_mask is all zero)"
            raise ValueError(msg)
        rows.append(tokens)
    return rows


def sampling_params_dict(
    sampling: SamplingParams, *, stop_token_ids: Iterable[int], seed: int | None = None
) -> dict[str, Any]:
    """rlcore ``SamplingParams`` -> one SGLang ``sampling_params`` dict.

    Every knob that changes the distribution is set explicitly (penalties off, ``min_p`` 0), so
    no server-side default (``preferred_sampling_params``, a checkpoint's generation config)
    changes what the loss assumes was sampled.
    """
    greedy = sampling.greedy
    params: dict[str, Any] = {
        "max_new_tokens": int(sampling.max_new_tokens),
        # SGLang reads temperature < 1e-6 as greedy (top_k = 1, logits unscaled).
        "temperature": 0.0 if greedy else float(sampling.temperature),
        "top_p": 1.0 if greedy else float(sampling.top_p),
        # -1 is SGLang's "off"; 0 (HF's "off") is refused by its verify().
        "top_k": -1 if greedy or sampling.top_k <= 0 else int(sampling.top_k),
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "min_new_tokens": 0,
        "stop_token_ids": sorted({int(t) for t in stop_token_ids}),
        "ignore_eos": False,
        # One response per request: rlcore expands rows on the driver.
        "n": 1,
        # Text only (ids are never trimmed): keep it faithful for debugging.
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if seed is not None:
        params["sampling_seed"] = int(seed)
    return params


def request_seed(base: int, call: int, row: int) -> int:
    """A 63-bit seed for one request, from (rollout seed, generate call, row): reruns reproduce."""
    import numpy as np

    state = np.random.SeedSequence([base & 0xFFFFFFFF, call, row]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) | (int(state[1]) >> 1)


# --- outputs ------------------------------------------------------------------------------


def finish_reason_of(reason: Any, row: int) -> FinishReason:
    """SGLang's ``meta_info["finish_reason"]`` dict -> ``"stop"`` or ``"length"``."""
    kind = reason.get("type") if isinstance(reason, Mapping) else None
    if kind in ("stop", "length"):
        return "stop" if kind == "stop" else "length"
    if kind == "abort":
        msg = f"SGLang aborted request {row}: {reason.get('message') or 'no message'}"
        raise SGLangOutputError(msg)
    msg = f"SGLang output {row}: unexpected finish_reason {reason!r} (request not finished?)"
    raise SGLangOutputError(msg)


def completion_from_output(
    output: Any, *, row: int, max_new_tokens: int, with_log_probs: bool
) -> Completion:
    """One SGLang output dict -> :class:`Completion` (ids, per-token log-probs, finish reason)."""
    if not isinstance(output, Mapping) or not isinstance(output.get("meta_info"), Mapping):
        msg = f"SGLang output {row}: expected a dict with 'output_ids' and 'meta_info', got "
        msg += repr(output)[:200]
        raise SGLangOutputError(msg)
    meta = output["meta_info"]
    ids = output.get("output_ids")
    if not isinstance(ids, Sequence) or not all(isinstance(t, int) for t in ids):
        msg = f"SGLang output {row}: 'output_ids' must be a list of ints, got {ids!r}"[:300]
        raise SGLangOutputError(msg)
    token_ids = [int(t) for t in ids]
    reason = finish_reason_of(meta.get("finish_reason"), row)
    if len(token_ids) > max_new_tokens:
        msg = (
            f"SGLang output {row}: {len(token_ids)} tokens, more than max_new_tokens="
            f"{max_new_tokens}"
        )
        raise SGLangOutputError(msg)
    log_probs = None
    if with_log_probs:
        log_probs = _output_log_probs(meta.get("output_token_logprobs"), token_ids, row)
    return Completion(token_ids=token_ids, log_probs=log_probs, finish_reason=reason)


def _output_log_probs(entries: Any, token_ids: list[int], row: int) -> list[float]:
    # Entries are (logprob, token_id, text-or-None) tuples, one per output token.
    if not isinstance(entries, Sequence) or len(entries) != len(token_ids):
        got = len(entries) if isinstance(entries, Sequence) else repr(entries)
        msg = (
            f"SGLang output {row}: meta_info['output_token_logprobs'] must hold one entry per "
            f"output token ({len(token_ids)}), got {got} (was return_logprob=True sent?)"
        )
        raise SGLangOutputError(msg)
    values = []
    for pos, (entry, token) in enumerate(zip(entries, token_ids)):
        if not isinstance(entry, Sequence) or len(entry) < 2 or entry[1] != token:
            msg = (
                f"SGLang output {row}: output_token_logprobs[{pos}] = {entry!r} does not "
                f"belong to output token {token}"
            )
            raise SGLangOutputError(msg)
        values.append(float(entry[0]))
    return values


def batch_tensors(
    completions: Sequence[Completion],
    *,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_pos: torch.Tensor,
    max_new_tokens: int,
    pad_token_id: int,
    eos_token_ids: Sequence[int],
    with_log_probs: bool,
) -> dict[str, torch.Tensor]:
    """Completions (one per prompt row) -> the rollout output tensors (HF rollout's layout)."""
    import torch

    b, r = len(completions), max_new_tokens
    if prompt_ids.shape[0] != b:
        msg = f"{b} completions for {prompt_ids.shape[0]} prompt rows: SGLang lost requests"
        raise SGLangOutputError(msg)
    responses = torch.full((b, r), pad_token_id, dtype=torch.long)
    lengths = torch.zeros((b, 1), dtype=torch.long)
    log_probs = torch.zeros((b, r), dtype=torch.float32)
    for i, c in enumerate(completions):
        n = len(c.token_ids)
        responses[i, :n] = torch.tensor(c.token_ids, dtype=torch.long)
        lengths[i] = n
        if with_log_probs and c.log_probs is not None:
            log_probs[i, :n] = torch.tensor(c.log_probs, dtype=torch.float32)
    response_mask = _response_mask(responses, lengths, eos_token_ids)  # (B, R)
    return rollout_tensors(
        prompt_ids, prompt_mask, prompt_pos.to(torch.long), responses, response_mask,
        log_probs=log_probs if with_log_probs else None,
    )  # fmt: skip


def _response_mask(
    responses: torch.Tensor, lengths: torch.Tensor, eos_ids: Sequence[int]
) -> torch.Tensor:
    """1 up to and including the first EOS, 0 after and on padding: (B, R) int64.

    From EOS (as the HF rollout does, since pad and EOS may share an id) and from the length
    SGLang returned (so a stop on a token rlcore does not count as EOS still masks the pad).
    """
    import torch

    is_eos = torch.isin(responses, torch.tensor(list(eos_ids), dtype=responses.dtype))
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    within = torch.arange(responses.shape[1]).unsqueeze(0) < lengths  # (B, R)
    return ((eos_before == 0) & within).long()


# --- weights ------------------------------------------------------------------------------


def bucket_named_tensors(
    named_tensors: Iterable[tuple[str, T]], bucket_bytes: int
) -> Iterator[list[tuple[str, T]]]:
    """Group a stream of (name, tensor) into lists of at most ``bucket_bytes`` (a larger tensor
    travels alone), keeping order; the stream is consumed lazily, one bucket in memory."""
    if bucket_bytes < 1:
        msg = f"bucket_bytes must be >= 1, got {bucket_bytes}"
        raise ValueError(msg)
    bucket: list[tuple[str, T]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = int(tensor.numel()) * int(tensor.element_size())  # type: ignore[attr-defined]
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
