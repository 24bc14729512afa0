"""Loss aggregation, the PPO clipped policy loss (and GSPO), and the clipped value loss.

Normalisation (results depend on it, so every loss says which one it uses). A loss on one
micro-batch is normalised by the *mini-batch* totals (:class:`rlcore.interfaces.BatchTotals`,
over all micro-batches and data-parallel ranks), so summing micro-batch losses gives the
mini-batch loss exactly and the gradient does not depend on how the batch was split:

- ``token-mean``: sum of token losses / ``totals.tokens``.
- ``seq-mean-token-sum``: sum over rows of each row's token sum / ``totals.sequences``.
- ``seq-mean-token-mean``: sum over rows of each row's token mean / ``totals.sequences``.
- ``seq-mean-token-sum-norm`` (Dr. GRPO): sum over rows of (row token sum /
  ``totals.max_response_length``) / ``totals.sequences`` (verl's ``loss_scale_factor``).

``totals.sequences`` counts rows, fully masked ones included (as verl's ``global_batch_size``).
Without ``totals`` the micro-batch's own counts are used (a single micro-batch, or metrics).
"""

from __future__ import annotations

from typing import Literal

import torch

from rlcore.interfaces import BatchTotals
from rlcore.rl.masked import masked_mean, masked_sum

__all__ = [
    "LOSS_AGG_MODES",
    "LossAggMode",
    "agg_loss",
    "compute_policy_loss_gspo",
    "compute_policy_loss_vanilla",
    "compute_value_loss",
]

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# (loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower); the last three are detached scalars.
PolicyLossResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def local_totals(response_mask: torch.Tensor) -> BatchTotals:
    """The totals of this micro-batch alone (B, R mask)."""
    return BatchTotals(
        tokens=int(response_mask.sum().item()),
        sequences=int(response_mask.shape[0]),
        max_response_length=int(response_mask.shape[-1]),
    )


def agg_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    totals: BatchTotals | None = None,
) -> torch.Tensor:
    """Aggregate a (B, R) loss matrix to a scalar; see the module docstring for each mode.

    A zero total (no valid token, no row) gives a zero loss that still carries a graph.
    """
    if totals is None:
        totals = local_totals(response_mask)
    mask = response_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, mask) / max(totals.tokens, 1)
    seq_sums = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / mask.sum(dim=-1).clamp(min=1)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = seq_sums / max(totals.max_response_length, 1)
    else:
        expected = ", ".join(LOSS_AGG_MODES)
        msg = f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {expected}"
        raise ValueError(msg)
    return seq_losses.sum() / max(totals.sequences, 1)


def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    totals: BatchTotals | None = None,
) -> PolicyLossResult:
    """PPO clipped objective, clip-higher and dual-clip (verl's ``compute_policy_loss_vanilla``).

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``; per token
    ``L = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))`` and,
    where ``A < 0``, dual-clip bounds it by ``-A * clip_ratio_c`` (arXiv 1912.09729).
    Metrics are token means over this micro-batch: ``pg_clipfrac`` (the clipped term was
    larger), ``pg_clipfrac_lower`` (dual-clip active), ``ppo_kl`` (mean of
    ``old_log_prob - log_prob``, clamped as the ratio is).
    """
    if clip_ratio_c <= 1.0:
        msg = f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}"
        raise ValueError(msg)
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)  # (b, R)
    ratio = torch.exp(neg_approx_kl)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_ratio_c
    dual = torch.minimum(clipped, losses3)
    pg_losses = torch.where(advantages < 0, dual, clipped)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, totals)
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).to(log_prob.dtype), response_mask)
        lower = ((clipped > losses3) & (advantages < 0)).to(log_prob.dtype)
        clipfrac_lower = masked_mean(lower, response_mask)
        ppo_kl = masked_mean(-neg_approx_kl, response_mask)
    return loss, clipfrac, ppo_kl, clipfrac_lower


def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "seq-mean-token-mean",
    totals: BatchTotals | None = None,
) -> PolicyLossResult:
    """GSPO, a sequence-level importance ratio (arXiv 2507.18071), as verl's GSPO loss.

    ``s_i = exp(mean over valid t of (log_prob - old_log_prob))``; per token the ratio is
    ``sg[s_i] * pi / sg[pi]`` (value ``s_i``, gradient through each token's log-prob), its log
    clamped at 10; then the clipped objective (no dual-clip). The paper aggregates with
    ``seq-mean-token-mean``; the configured mode is used. ``pg_clipfrac_lower`` is 0.
    """
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = log_prob - old_log_prob  # (b, R)
    seq_lengths = mask.sum(dim=-1).clamp(min=1)  # (b,)
    seq_log_ratio = masked_sum(neg_approx_kl, mask, dim=-1) / seq_lengths  # (b,)
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(losses1, losses2)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, totals)
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).to(log_prob.dtype), mask)
        ppo_kl = masked_mean(-neg_approx_kl, mask)
    return loss, clipfrac, ppo_kl, torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    totals: BatchTotals | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ``0.5 * agg(max((v - R)^2, (v_clip - R)^2))``, and the clip fraction.

    ``v_clip = clamp(v, values - cliprange_value, values + cliprange_value)`` keeps the new
    value prediction near the one the advantages were computed with (``values``).
    """
    vclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns).square()
    losses2 = (vclipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(losses1, losses2), response_mask, loss_agg_mode, totals)
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).to(vpreds.dtype), response_mask)
    return loss, clipfrac
