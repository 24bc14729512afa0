"""Log-probabilities and entropy of response tokens from logits, in float32."""

from __future__ import annotations

import torch


def response_logits(logits: torch.Tensor, response_length: int) -> torch.Tensor:
    """Logits that predict the response tokens: positions ``P-1 .. P+R-2``.

    ``logits`` is (b, T) for the whole sequence or (b, R+1, V) for its last ``R+1`` positions
    (``logits_to_keep=R+1``); either way the prediction of response token ``j`` sits at
    ``-(R+1)+j``. Returns (b, R, V).
    """
    return logits[:, -(response_length + 1) : -1, :]


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) for (b, R, V) logits and (b, R) labels, computed in float32 -> (b, R)."""
    logits = logits.float()
    # logsumexp + gather instead of a full log_softmax: one (b, R, V) temporary fewer.
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)  # (b, R)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the vocabulary, float32: (b, R, V) -> (b, R)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
