"""Loss aggregation, policy losses (PPO clipped, GSPO, CISPO, GPG, SAPO, GMPO, KL-Cov), value loss.

Normalisation (results depend on it, so every loss says which one it uses). A loss on one
micro-batch is normalised by the *mini-batch* totals (:class:`rlcore.interfaces.BatchTotals`,
over all micro-batches and data-parallel ranks), so summing micro-batch losses gives the
mini-batch loss exactly and the gradient does not depend on how the batch was split:

- ``token-mean``: sum of token losses / ``totals.tokens``.
- ``token-sum``: sum of token losses, unnormalised (each token counts fully: the gradient
  grows with the number of tokens; pair it with a smaller learning rate).
- ``seq-mean-token-sum``: sum over rows of each row's token sum / ``totals.sequences``.
- ``seq-mean-token-mean``: sum over rows of each row's token mean / ``totals.sequences``.
- ``seq-mean-token-sum-norm`` (Dr. GRPO): sum over rows of (row token sum /
  ``totals.max_response_length``) / ``totals.sequences`` (verl's ``loss_scale_factor``).

``totals.sequences`` counts rows, fully masked ones included (as verl's ``global_batch_size``).
Without ``totals`` the micro-batch's own counts are used (a single micro-batch, or metrics).

Every policy loss takes ``rollout_is_weights`` (B, R), detached truncated importance weights
``pi_old / pi_rollout`` (:mod:`rlcore.rl.rollout_is`), multiplying each token's loss (GMPO:
their per-row geometric mean multiplies the row's loss), as verl's ``rollout_is_weights``.
Masks select (``torch.where``): a NaN or inf at a padded position never reaches a loss.

Every policy loss has the one signature of :class:`rlcore.rl.registry.PolicyLossFn` and is
registered by name (:mod:`rlcore.builtin`; ``[algorithm] policy_loss``). Each is written
as a body that returns its :class:`PolicyLossTerms` (per-token losses, the ``ppo_kl`` matrix,
the clipped tokens); :func:`policy_loss_fn` wraps it in the shared head (padding zeroed) and
tail (rollout IS weights, aggregation by ``loss_agg_mode``, metrics). A loss reads its options
from the algorithm's ``Config`` (``config.clip_ratio_low``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

import attrs
import torch

from rlcore.interfaces import BatchTotals
from rlcore.rl.masked import apply_mask, masked_mean, masked_sum

if TYPE_CHECKING:
    from rlcore.rl.registry import PolicyLossFn

__all__ = [
    "LOSS_AGG_MODES",
    "LossAggMode",
    "PolicyLossBody",
    "PolicyLossTerms",
    "advantage_scaled",
    "agg_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_gmpo",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_value_loss",
    "is_advantage_scaled",
    "local_metric",
    "local_totals",
    "policy_loss_fn",
    "policy_loss_tail",
]

LossAggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
# The same names at run time (config validation, error messages), in the Literal's order.
LOSS_AGG_MODES: tuple[str, ...] = get_args(LossAggMode)


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
    mask = response_mask
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, mask) / max(totals.tokens, 1)
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, mask)
    seq_sums = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / (mask != 0).sum(dim=-1).clamp(min=1).to(loss_mat.dtype)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = seq_sums / max(totals.max_response_length, 1)
    else:
        expected = ", ".join(LOSS_AGG_MODES)
        msg = f"unknown loss_agg_mode {loss_agg_mode!r}; expected one of {expected}"
        raise ValueError(msg)
    return seq_losses.sum() / max(totals.sequences, 1)


def local_metric(value: torch.Tensor, mode: str, totals: BatchTotals, mask: torch.Tensor) -> float:
    """Undo the mini-batch normaliser: the micro-batch's own aggregate, for logging.

    Losses are divided by mini-batch totals (so micro-batch losses sum to the mini-batch
    loss); metrics report each micro-batch's own mean, which the engine then averages.
    """
    if mode == "token-sum":
        return float(value.detach().item())  # not normalised by totals
    if mode == "token-mean":
        local = int(mask.sum().item())
        scale = totals.tokens / local if local else 0.0
    else:
        local = int(mask.shape[0])
        scale = totals.sequences / local if local else 0.0
    return float(value.detach().item()) * scale


# --- the shared head and tail of every policy loss -------------------------------------------


@attrs.frozen(kw_only=True)
class PolicyLossTerms:
    """What a policy loss body computes; :func:`policy_loss_tail` turns it into the loss.

    Exactly one of:

    - ``token_losses`` (b, R): each token's loss. The tail multiplies it by the rollout IS
      weights and aggregates it with ``loss_agg_mode`` over ``totals``.
    - ``row_losses`` (b,): one loss per row (GMPO). The tail multiplies each by the per-row
      geometric mean of the IS weights and divides the sum over rows with a valid token by
      ``totals.sequences`` (``loss_agg_mode`` does not apply).

    ``kl`` (b, R): ``actor/ppo_kl`` is its masked mean. ``clipped`` / ``clipped_lower`` (b, R),
    bool or 0/1: the tokens ``actor/pg_clipfrac`` / ``actor/pg_clipfrac_lower`` count (None:
    0). ``metrics``: the loss's own extra metrics, passed through.
    """

    token_losses: torch.Tensor | None = None
    row_losses: torch.Tensor | None = None
    kl: torch.Tensor
    clipped: torch.Tensor | None = None
    clipped_lower: torch.Tensor | None = None
    metrics: Mapping[str, float] = attrs.field(factory=dict)


# body(old_log_prob, log_prob, advantages, response_mask, config) -> terms; the inputs come
# with padded positions zeroed.
PolicyLossBody = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Any], PolicyLossTerms
]


def policy_loss_tail(
    terms: PolicyLossTerms,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    totals: BatchTotals | None,
    rollout_is_weights: torch.Tensor | None,
    like: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, metrics)`` from the terms: IS weights, aggregation, then the metrics.

    ``like`` (the log-probs) gives the metrics' dtype and device. Metrics are this
    micro-batch's own token means (``actor/pg_loss`` undone from the mini-batch normaliser).
    """
    if totals is None:
        totals = local_totals(response_mask)
    mask = response_mask
    if (terms.token_losses is None) == (terms.row_losses is None):
        msg = "a policy loss returns exactly one of token_losses and row_losses"
        raise ValueError(msg)
    if terms.token_losses is not None:
        pg_losses = _weighted(terms.token_losses, rollout_is_weights, mask)
        loss = agg_loss(pg_losses, mask, loss_agg_mode, totals)
        metric_mode = loss_agg_mode
    else:
        assert terms.row_losses is not None  # checked above; for mypy
        seq_losses = terms.row_losses  # (b,)
        if rollout_is_weights is not None:
            lengths = _lengths(mask, like.dtype)  # (b,)
            log_w = torch.log(rollout_is_weights.detach().to(like.dtype) + 1e-10)
            seq_losses = seq_losses * torch.exp(masked_sum(log_w, mask, dim=-1) / lengths)
        rows = (mask != 0).any(dim=-1)
        loss = apply_mask(seq_losses, rows).sum() / max(totals.sequences, 1)
        metric_mode = "seq-mean-token-sum"  # a per-row loss over totals.sequences
    with torch.no_grad():
        clipfrac = _fraction(terms.clipped, mask, like)
        clipfrac_lower = _fraction(terms.clipped_lower, mask, like)
        ppo_kl = masked_mean(terms.kl, mask)
    metrics = {
        "actor/pg_loss": local_metric(loss, metric_mode, totals, mask),
        "actor/pg_clipfrac": float(clipfrac.item()),
        "actor/pg_clipfrac_lower": float(clipfrac_lower.item()),
        "actor/ppo_kl": float(ppo_kl.item()),
        **terms.metrics,
    }
    return loss, metrics


def policy_loss_fn(body: PolicyLossBody) -> PolicyLossFn:
    """A registrable :class:`~rlcore.rl.registry.PolicyLossFn` from a body returning
    :class:`PolicyLossTerms`: the head selects padded positions to 0 (so a NaN there reaches
    neither the loss nor the gradient), the tail is :func:`policy_loss_tail`."""

    def loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        loss_agg_mode: str,
        config: Any,
        totals: BatchTotals | None = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        old_log_prob, log_prob, advantages = _valid_only(
            response_mask, old_log_prob, log_prob, advantages
        )
        terms = body(old_log_prob, log_prob, advantages, response_mask, config)
        return policy_loss_tail(
            terms,
            response_mask,
            loss_agg_mode=loss_agg_mode,
            totals=totals,
            rollout_is_weights=rollout_is_weights,
            like=log_prob,
        )

    # Not functools.wraps: its __wrapped__ would make inspect.signature report the body's
    # five parameters instead of the registry's signature.
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(loss, attr, getattr(body, attr))
    return loss


# The policy losses declared advantage-scaled: a value read by is_advantage_scaled, not an
# attribute set on each function. Filled as each loss's module is imported, in every process.
_ADVANTAGE_SCALED: set[PolicyLossFn] = set()


def advantage_scaled(loss: PolicyLossFn) -> PolicyLossFn:
    """Mark a policy loss every term of which is a multiple of the advantage: a row of zero
    advantages adds exactly nothing to its gradient, so workers may leave such rows out of
    the backward pass (:attr:`~rlcore.interfaces.BaseAlgorithm.zero_advantage_rows_inert`).
    A loss without the mark (``kl_cov``, whose penalty does not vanish with the advantage;
    any plugin's that does not say) keeps every row."""
    _ADVANTAGE_SCALED.add(loss)
    return loss


def is_advantage_scaled(loss: PolicyLossFn) -> bool:
    """Whether ``loss`` was declared :func:`advantage_scaled`."""
    return loss in _ADVANTAGE_SCALED


def _valid_only(mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The inputs with padded positions set to 0 (selected, so gradients there are 0 too).

    Selecting only the loss matrix is not enough for the backward pass: the gradient of
    ``adv * log_prob`` at a padded token is ``0 * adv``, NaN when ``adv`` is NaN there.
    """
    return [apply_mask(x, mask) for x in tensors]


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def _fraction(flags: torch.Tensor | None, mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Masked mean of 0/1 flags in ``like``'s dtype; no flags: 0."""
    if flags is None:
        return _zero(like)
    return masked_mean(flags.to(like.dtype), mask)


def _lengths(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Valid tokens per row (b,), at least 1."""
    return (mask != 0).sum(dim=-1).clamp(min=1).to(dtype)


def _weighted(
    pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """Token losses times the detached rollout IS weights (selected on valid tokens)."""
    if rollout_is_weights is None:
        return pg_losses
    return pg_losses * apply_mask(rollout_is_weights.detach().to(pg_losses.dtype), mask)


def _log_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    # log(pi / pi_old), clamped as verl does before exp().
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


# --- the policy losses (bodies; registered in rlcore.builtin) -----------------------------


@advantage_scaled
@policy_loss_fn
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``vanilla``: PPO clipped objective, clip-higher and dual-clip (verl's
    ``compute_policy_loss_vanilla``).

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``; per token
    ``L = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))`` and,
    where ``A < 0``, dual-clip bounds it by ``-A * clip_ratio_c`` (arXiv 1912.09729).
    Metrics: ``pg_clipfrac`` (the clipped term was larger), ``pg_clipfrac_lower`` (dual-clip
    active), ``ppo_kl`` (mean of ``old_log_prob - log_prob``, clamped as the ratio is).
    """
    low, high, clip_ratio_c = config.clip_ratio_low, config.clip_ratio_high, config.clip_ratio_c
    if clip_ratio_c <= 1.0:
        msg = f"clip_ratio_c must be > 1.0 for dual-clip PPO, got {clip_ratio_c}"
        raise ValueError(msg)
    neg_approx_kl = _log_ratio(old_log_prob, log_prob)  # (b, R)
    ratio = torch.exp(neg_approx_kl)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_ratio_c
    dual = torch.minimum(clipped, losses3)
    return PolicyLossTerms(
        token_losses=torch.where(advantages < 0, dual, clipped),
        kl=-neg_approx_kl,
        clipped=losses2 > losses1,
        clipped_lower=(clipped > losses3) & (advantages < 0),
    )


@advantage_scaled
@policy_loss_fn
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``gspo``: a sequence-level importance ratio (arXiv 2507.18071), as verl's GSPO loss.

    ``s_i = exp(mean over valid t of (log_prob - old_log_prob))``; per token the ratio is
    ``sg[s_i] * pi / sg[pi]`` (value ``s_i``, gradient through each token's log-prob), its log
    clamped at 10; then the clipped objective (no dual-clip). The paper aggregates with
    ``seq-mean-token-mean``; the configured mode is used. ``pg_clipfrac_lower`` is 0.
    """
    mask = response_mask
    neg_approx_kl = log_prob - old_log_prob  # (b, R)
    seq_lengths = _lengths(mask, log_prob.dtype)  # (b,)
    seq_log_ratio = masked_sum(neg_approx_kl, mask, dim=-1) / seq_lengths  # (b,)
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(
        ratio, 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    )
    return PolicyLossTerms(
        token_losses=torch.maximum(losses1, losses2), kl=-neg_approx_kl, clipped=losses2 > losses1
    )


@advantage_scaled
@policy_loss_fn
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``cispo`` (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

    Per token ``L = -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log pi``
    with ``r = exp(log pi - log pi_old)`` (log clamped at +-20): every token keeps a
    gradient ``-clip(r) * A * grad log pi``, even where PPO would have clipped it away.
    ``pg_clipfrac``: tokens whose weight was clipped. As verl's ``compute_policy_loss_cispo``.
    """
    neg_approx_kl = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(neg_approx_kl)
    low, high = config.clip_ratio_low, config.clip_ratio_high
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high).detach()
    return PolicyLossTerms(
        token_losses=-clipped * advantages * log_prob, kl=-neg_approx_kl, clipped=ratio != clipped
    )


@advantage_scaled
@policy_loss_fn
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``gpg`` (arXiv 2504.02546): plain policy gradient, ``L = -A * log pi`` per token.

    No ratio and no clipping (one update per batch is the intended use; ``old_log_prob``
    only feeds the ``ppo_kl`` metric). As verl's ``compute_policy_loss_gpg``.
    """
    return PolicyLossTerms(token_losses=-advantages * log_prob, kl=old_log_prob - log_prob)


@advantage_scaled
@policy_loss_fn
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``sapo`` (arXiv 2511.20347): a smooth, temperature-controlled gate instead of a hard clip.

    Per token ``L = -f(r) * A`` with ``f(r) = sigmoid(tau * (r - 1)) * 4 / tau``, ``tau =
    sapo_tau_pos`` where ``A > 0`` else ``sapo_tau_neg`` (``f'(1) = 1``: on-policy it is the
    plain gradient; far from 1 the gradient fades). verl always aggregates SAPO with
    ``seq-mean-token-mean`` (the paper's); here the configured mode is used. Clip fractions
    are 0.
    """
    neg_approx_kl = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(neg_approx_kl)
    taus = torch.where(
        advantages > 0,
        torch.tensor(config.sapo_tau_pos, dtype=log_prob.dtype, device=log_prob.device),
        torch.tensor(config.sapo_tau_neg, dtype=log_prob.dtype, device=log_prob.device),
    )
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    return PolicyLossTerms(token_losses=-gates * advantages, kl=-neg_approx_kl)


@advantage_scaled
@policy_loss_fn
def compute_policy_loss_gmpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``gmpo`` (arXiv 2507.20673): the geometric mean of the token ratios, clipped per token.

    With ``d_t = log pi - log pi_old`` and ``s = sign(A_t)``, each token's log-ratio is
    clipped in log space, pessimistically: ``c_t = s * min(s * d_t, s * clip(d_t,
    -clip_ratio_low, clip_ratio_high))`` (so the bounds are ``exp(-low)``, ``exp(high)`` on
    the ratio: the paper's ``(e^-0.4, e^0.4)`` is low = high = 0.4). A row's loss is
    ``-mean_t(A_t) * exp(mean_t c_t)``; the loss is the sum over rows / ``totals.sequences``
    (verl: the mean over the rows; ``loss_agg_mode`` does not apply). Rollout IS weights
    enter as their per-row geometric mean. ``pg_clipfrac`` / ``pg_clipfrac_lower``: clipped
    tokens with ``A > 0`` / ``A < 0``. As verl's ``compute_policy_loss_geo_mean`` (which does
    not clamp ``d_t`` at +-20; neither do we).
    """
    dtype = log_prob.dtype
    neg_approx_kl = apply_mask(log_prob - old_log_prob, response_mask)
    sign = torch.sign(advantages)
    clamped = torch.clamp(neg_approx_kl, -config.clip_ratio_low, config.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * neg_approx_kl, sign * clamped)
    lengths = _lengths(response_mask, dtype)  # (b,)
    seq_ratio = torch.exp(masked_sum(pessimistic, response_mask, dim=-1) / lengths)
    seq_adv = masked_sum(advantages, response_mask, dim=-1) / lengths
    was_clipped = (neg_approx_kl != clamped).to(dtype)
    return PolicyLossTerms(
        row_losses=-seq_adv * seq_ratio,  # (b,)
        kl=-neg_approx_kl,
        clipped=was_clipped * (advantages > 0).to(dtype),
        clipped_lower=was_clipped * (advantages < 0).to(dtype),
    )


@policy_loss_fn
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """``kl_cov`` (arXiv 2505.22617): a KL penalty on the tokens that drive entropy collapse.

    Per token ``L = -A * r`` (``r = exp(log pi - log pi_old)``, no clip); on the
    ``max(1, int(kl_cov_ratio * N))`` valid tokens of this micro-batch with the largest
    ``cov_t = (A_t - mean A) * (log pi_t - mean log pi)`` (means over the N valid tokens,
    detached) it is ``-A * r + ppo_kl_coef * |log r|``. As verl's
    ``compute_policy_loss_kl_cov``, the selection is per micro-batch, so unlike the other
    losses the gradient depends on how a mini-batch is split. ``ppo_kl`` is the mean
    ``|log r|`` (verl's metric); clip fractions are 0. (Clip-Cov, the paper's other variant,
    picks its tokens at random, unseeded in verl; it is not provided.)
    """
    kl_cov_ratio = config.kl_cov_ratio
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    valid = response_mask != 0
    n_valid = int(valid.sum().item())
    if n_valid > 0 and kl_cov_ratio > 0:
        with torch.no_grad():
            adv_v, lp_v = advantages[valid], log_prob.detach()[valid]
            cov = (adv_v - adv_v.mean()) * (lp_v - lp_v.mean())
            k = max(1, int(n_valid * kl_cov_ratio))
            chosen_flat = torch.nonzero(valid.reshape(-1)).squeeze(-1)[torch.topk(cov, k).indices]
            chosen = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
            chosen[chosen_flat] = True
            chosen = chosen.view_as(valid)
        penalty = config.ppo_kl_coef * log_ratio.abs()
        pg_losses = torch.where(chosen, pg_losses + penalty, pg_losses)
    return PolicyLossTerms(token_losses=pg_losses, kl=log_ratio.abs())


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
    vpreds, returns, values = _valid_only(response_mask, vpreds, returns, values)
    vclipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses1 = (vpreds - returns).square()
    losses2 = (vclipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(losses1, losses2), response_mask, loss_agg_mode, totals)
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).to(vpreds.dtype), response_mask)
    return loss, clipfrac
