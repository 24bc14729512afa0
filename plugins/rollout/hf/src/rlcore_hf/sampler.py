"""Sampling the next token by inverse CDF inside ``generate``, instead of ``torch.multinomial``.

Why: on a CPU, ``torch.multinomial`` over 128 rows of a 259-token vocabulary took 0.84 ms per
decoding step here, a cumulative sum and ``searchsorted`` 0.05 ms: about a tenth of
``generate``'s time on ``benchmarks/vs_trl.py``'s dense row (64 steps). Both draw exactly from
softmax(scores); the random stream differs, so the tokens of a seed differ from
``torch.multinomial``'s.

How, without a generation loop of our own: :class:`InverseCdfSampler` is the last logits
processor of a *greedy* ``generate`` call. It applies the sampling warpers ``generate`` would
have applied (temperature, top-k, top-p, in ``generate``'s order, each only where it changes
something), draws one token per row from the result, and returns scores that are 0 at that
token and -inf elsewhere, so the greedy argmax picks it. ``output_logits`` still returns the raw
logits, from which the rollout's log-probs are computed.

The draw: ``u ~ U[0, 1) * total`` against the float64 cumulative sum, ``searchsorted`` with
``right=True`` (the first token whose cumulative probability exceeds ``u``): a token of
probability 0 (filtered by top-k/top-p) is never picked, since its cumulative value equals its
predecessor's.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

__all__ = ["InverseCdfSampler", "MultinomialSampler"]


def _warp(
    warpers: list[LogitsProcessor], input_ids: torch.Tensor, scores: torch.Tensor
) -> torch.Tensor:
    for warper in warpers:
        scores = warper(input_ids, scores)
    return scores


def _warpers(temperature: float, top_k: int, top_p: float) -> list[LogitsProcessor]:
    """``generate``'s sampling warpers, in its order, each only where it changes something."""
    warpers: list[LogitsProcessor] = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


class InverseCdfSampler(LogitsProcessor):
    """One sampled token per row, as a one-hot score for ``generate(do_sample=False)``."""

    def __init__(self, *, temperature: float, top_k: int, top_p: float) -> None:
        # Called one by one, not through a LogitsProcessorList, which inspects each
        # processor's signature at every step (~0.1 ms per step here).
        self.warpers = _warpers(temperature, top_k, top_p)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = self.draw(input_ids, scores)
        picked = torch.full_like(scores, float("-inf"))
        return picked.scatter_(-1, tokens, 0.0)

    def draw(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(b, 1) token ids, one per row, drawn from the warped ``scores`` (b, V)."""
        scores = _warp(self.warpers, input_ids, scores)
        cdf = torch.softmax(scores.double(), dim=-1).cumsum_(-1)  # (b, V)
        draw = torch.rand(cdf.shape[0], 1, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
        return torch.searchsorted(cdf, draw, right=True).clamp_(max=cdf.shape[-1] - 1)


class MultinomialSampler:
    """``generate(do_sample=True)``'s own draw (``torch.multinomial``), for a loop of our own
    (rlcore_hf.compiled_decode): the same warpers, the same random stream."""

    def __init__(self, *, temperature: float, top_k: int, top_p: float) -> None:
        self.warpers = _warpers(temperature, top_k, top_p)

    def draw(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """(b, 1) token ids drawn from softmax(warped ``scores``)."""
        scores = _warp(self.warpers, input_ids, scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)
