"""Log-probabilities and entropy from logits: float32, chunked over tokens, so no float32
(B, T, vocab) tensor is materialised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOG_PROB_CHUNK_TOKENS",
    "entropy_from_logits",
    "log_probs_from_logits",
]


# Response tokens per chunk of the float32 log-softmax: (chunk, V) float32 temporaries, e.g.
# 1024 x 152k x 4 B = 620 MB for Qwen2.5, instead of (b * R, V) for the whole micro-batch.
LOG_PROB_CHUNK_TOKENS = 1024


def _chunk_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) of one (n, V) chunk in float32 -> (n,)."""
    import torch

    chunk = logits.float()
    picked = torch.gather(chunk, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(chunk, dim=-1)


def _chunk_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax over one (n, V) chunk in float32 -> (n,)."""
    import torch

    chunk = logits.float()
    probs = torch.softmax(chunk, dim=-1)
    return torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1)


def _chunked(
    fn: Any, tensors: list[torch.Tensor], chunk_tokens: int | None, *, recompute: bool
) -> torch.Tensor:
    """``fn`` over row chunks of ``tensors``, concatenated.

    ``torch.split``, not slicing: the backward of a slice allocates a full-size zero
    gradient per chunk, the split's one concatenation. ``recompute``: under grad, run each
    chunk under activation checkpointing, so what ``fn`` saves for backward (a float32
    copy of bf16 logits, softmax probabilities) lives one chunk at a time.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    n = tensors[0].shape[0]
    if chunk_tokens is None or n <= chunk_tokens:
        return fn(*tensors)  # type: ignore[no-any-return]
    grad = recompute and torch.is_grad_enabled() and tensors[0].requires_grad
    parts = []
    for args in zip(*(torch.split(t, chunk_tokens) for t in tensors), strict=True):
        parts.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return torch.cat(parts)


def entropy_from_logits(
    logits: torch.Tensor, *, chunk_tokens: int | None = LOG_PROB_CHUNK_TOKENS
) -> torch.Tensor:
    """Entropy of softmax(logits) over the vocabulary, float32, chunked: (b, R, V) -> (b, R)."""
    b, r, v = logits.shape
    flat = [logits.reshape(b * r, v)]
    return _chunked(_chunk_entropy, flat, chunk_tokens, recompute=True).reshape(b, r)


def log_probs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int | None = LOG_PROB_CHUNK_TOKENS,
) -> torch.Tensor:
    """log p(label) for (b, R, V) logits (any float dtype) and (b, R) labels -> (b, R) float32.

    Memory-lean: the float32 upcast, ``exp`` and ``logsumexp`` run over ``chunk_tokens``
    tokens at a time, so no float32 (b, R, V) tensor exists at once. With gradient, each
    chunk of lower-precision logits is recomputed in the backward pass (activation
    checkpointing) instead of keeping its float32 copy; only the logits themselves are saved.
    float32 logits with gradient take one chunk (no copy to save). ``chunk_tokens=None``: one
    chunk (the plain path). Exact: the same float32 arithmetic per token either way.
    """
    import torch

    b, r, v = logits.shape
    flat = [logits.reshape(b * r, v), labels.reshape(b * r)]
    if logits.dtype == torch.float32 and torch.is_grad_enabled() and logits.requires_grad:
        # Nothing to save: no upcast copy exists, and chunking under grad only adds the
        # chunk gradients' concatenation (measured: higher peak, benchmarks/logprob_memory.py).
        chunk_tokens = None
    return _chunked(_chunk_log_probs, flat, chunk_tokens, recompute=True).reshape(b, r)
