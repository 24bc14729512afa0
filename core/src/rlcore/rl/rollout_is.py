"""Truncated importance weights between the trained policy and the rollout engine.

A vLLM/SGLang rollout samples from ``pi_rollout``, which differs from the trainer's
``pi_old`` (kernels, precision, quantisation), so the policy gradient is off-policy by
``pi_old / pi_rollout``. Truncated importance sampling (TIS, as verl's
``compute_rollout_correction_weights``) multiplies each token's policy loss by

- ``token``: ``w_t = min(exp(log pi_old_t - log pi_rollout_t), cap)``;
- ``sequence``: ``w = min(exp(sum over valid t of (log pi_old_t - log pi_rollout_t)), cap)``
  for every token of the row (unbiased for the sequence, higher variance);

with the log-ratio clamped at +-20 before ``exp`` (verl's ``SAFETY_BOUND``), weights 0 on
padding and detached (they correct the sampling distribution, they are not trained).
``log pi_rollout`` is the batch key ``rollout_log_probs`` (B, R) the rollout returns.
"""

from __future__ import annotations

from typing import Literal

import torch

from rlcore.rl.masked import apply_mask, masked_mean, masked_sum

__all__ = ["ROLLOUT_IS_LEVELS", "RolloutIS", "rollout_is_metrics", "rollout_is_weights"]

RolloutIS = Literal["none", "token", "sequence"]
ROLLOUT_IS_LEVELS: tuple[str, ...] = ("none", "token", "sequence")
_SAFETY_BOUND = 20.0


@torch.no_grad()
def rollout_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    level: str,
    cap: float = 2.0,
) -> torch.Tensor:
    """Truncated IS weights (B, R) at ``level`` (``token`` | ``sequence``), 0 on padding."""
    if cap <= 0:
        msg = f"rollout_is_cap must be > 0, got {cap}"
        raise ValueError(msg)
    log_ratio = apply_mask(old_log_prob - rollout_log_probs.to(old_log_prob.dtype), response_mask)
    if level == "token":
        weights = torch.exp(log_ratio.clamp(-_SAFETY_BOUND, _SAFETY_BOUND))
    elif level == "sequence":
        seq = masked_sum(log_ratio, response_mask, dim=-1).clamp(-_SAFETY_BOUND, _SAFETY_BOUND)
        weights = torch.exp(seq).unsqueeze(-1).expand_as(log_ratio)
    else:
        msg = f"unknown rollout_is level {level!r}; expected 'token' or 'sequence'"
        raise ValueError(msg)
    return apply_mask(weights.clamp(max=cap), response_mask)


@torch.no_grad()
def rollout_is_metrics(
    weights: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> dict[str, float]:
    """Mean weight and the fraction of tokens at the cap (truncated), for logging."""
    at_cap = (weights >= cap).to(weights.dtype)
    return {
        "actor/rollout_is_mean": float(masked_mean(weights, response_mask).item()),
        "actor/rollout_is_truncated_frac": float(masked_mean(at_cap, response_mask).item()),
    }
