"""Log-probabilities and entropy of response tokens from logits, in float32."""

from __future__ import annotations

import torch

from rlcore.engine import LOG_PROB_CHUNK_TOKENS
from rlcore.engine import entropy_from_logits as shared_entropy
from rlcore.engine import log_probs_from_logits as shared_log_probs


def response_logits(logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Logits that predict the response tokens: positions ``P-1 .. P+R-2``.

    ``logits`` is (b, T) for the whole sequence or (b, R+1, V) for its last ``R+1`` positions
    (``logits_to_keep=R+1``); either way the prediction of response token ``j`` sits at
    ``-(R+1)+j``. Returns (b, R, V).
    """
    return logits[:, -(response_length + 1) : -1, :]


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_tokens: int | None = LOG_PROB_CHUNK_TOKENS
) -> torch.Tensor:
    """log p(label) for (b, R, V) logits and (b, R) labels, computed in float32 -> (b, R).

    Chunked over ``chunk_tokens`` tokens (:func:`rlcore.engine.log_probs_from_logits`):
    no float32 (b, R, V) copy of the logits exists at once. None: one chunk.
    """
    return shared_log_probs(logits, labels, chunk_tokens=chunk_tokens)


def entropy_from_logits(
    logits: torch.Tensor, chunk_tokens: int | None = LOG_PROB_CHUNK_TOKENS
) -> torch.Tensor:
    """Entropy of softmax(logits) over the vocabulary, float32: (b, R, V) -> (b, R), chunked."""
    return shared_entropy(logits, chunk_tokens=chunk_tokens)
