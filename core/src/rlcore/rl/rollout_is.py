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

Masked importance sampling, beside the truncation, as verl 0.8 has it
(``verl/trainer/ppo/rollout_corr_helper.py``):

- IcePop's two-sided band (``compute_rollout_correction_weights`` with a ``"lower_upper"``
  ``rollout_is_threshold``; here ``rollout_is_threshold_lower`` and ``rollout_is_cap``): a
  weight outside ``[lower, cap]`` becomes 0 instead of being clipped; inside it is kept as is;
- rejection masks (``compute_rollout_rejection_mask``, ``rollout_rs``): a token, or every
  token of a sequence, whose divergence statistic between ``pi_rollout`` and ``pi_old`` leaves
  its bound is taken out of ``response_mask`` (the driver does it before the update, so the
  loss's token and sequence counts leave it out too). With ``log_ratio = log pi_old -
  log pi_rollout`` clamped at +-20: ``k1 = -log_ratio`` (two-sided: ``lower <= exp(k1) <=
  upper``), ``k2 = log_ratio**2 / 2``, ``k3 = exp(log_ratio) - 1 - log_ratio`` (upper only);
  ``token_k*`` per token, ``seq_sum_k*`` / ``seq_mean_k*`` / ``seq_max_k*`` over the row's
  valid tokens. Several options, comma-separated, must all pass.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from rlcore.rl.masked import apply_mask, masked_mean, masked_sum

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_OPTIONS",
    "RolloutIS",
    "parse_rollout_rs",
    "rollout_is_metrics",
    "rollout_is_weights",
    "rollout_rs_mask",
]

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
    lower: float | None = None,
) -> torch.Tensor:
    """IS weights (B, R) at ``level`` (``token`` | ``sequence``), 0 on padding: clipped at
    ``cap`` (TIS), or with ``lower`` zero outside ``[lower, cap]`` (IcePop)."""
    if cap <= 0:
        msg = f"rollout_is_cap must be > 0, got {cap}"
        raise ValueError(msg)
    if lower is not None and not 0 < lower <= cap:
        msg = f"rollout_is_threshold_lower must be in (0, rollout_is_cap={cap}], got {lower}"
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
    weights = apply_mask(weights, response_mask)
    if lower is None:
        return weights.clamp(max=cap)
    # IcePop (verl's compute_rollout_correction_weights, "lower_upper" threshold): the band
    # keeps a weight unchanged and drops (zeroes) one outside it.
    kept = (weights >= lower) & (weights <= cap)
    return torch.where(kept, weights, torch.zeros_like(weights))


@torch.no_grad()
def rollout_is_metrics(
    weights: torch.Tensor, response_mask: torch.Tensor, cap: float, lower: float | None = None
) -> dict[str, float]:
    """Mean weight and the fraction of tokens at the cap (truncated), for logging; with the
    IcePop band, the fraction of tokens outside it (verl's ``rollout_is_oob_ratio``), whose
    weights are 0."""
    if lower is not None:
        # A kept weight is in [lower, cap] > 0; a dropped one is exactly 0.
        oob = (weights == 0).to(weights.dtype)
        return {
            "actor/rollout_is_mean": float(masked_mean(weights, response_mask).item()),
            "actor/rollout_is_oob_ratio": float(masked_mean(oob, response_mask).item()),
        }
    at_cap = (weights >= cap).to(weights.dtype)
    return {
        "actor/rollout_is_mean": float(masked_mean(weights, response_mask).item()),
        "actor/rollout_is_truncated_frac": float(masked_mean(at_cap, response_mask).item()),
    }


# verl's SUPPORTED_ROLLOUT_RS_OPTIONS less "binary_kl" (KPop: not ported).
ROLLOUT_RS_OPTIONS: tuple[str, ...] = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def parse_rollout_rs(rollout_rs: str, threshold: str | None) -> dict[str, tuple[float, float]]:
    """``{option: (lower, upper)}`` from verl's ``rollout_rs`` / ``rollout_rs_threshold``.

    As verl's ``_parse_rollout_rs_thresholds``: one threshold for all options or one per
    option (comma-separated); a ``k1`` option takes ``"lower_upper"`` ratio bounds or one
    upper bound (lower ``1 / upper``); the others one upper bound (lower 0, unused).
    Raises ValueError in one line naming what is wrong.
    """
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if not options or unknown:
        msg = (
            f"rollout_rs: unknown option(s) {unknown or [rollout_rs]}; expected a "
            f"comma-separated list of {', '.join(ROLLOUT_RS_OPTIONS)}"
        )
        raise ValueError(msg)
    if threshold is None or not str(threshold).strip():
        msg = f'rollout_rs = {rollout_rs!r} needs rollout_rs_threshold (e.g. "0.5_2.0")'
        raise ValueError(msg)
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) not in (1, len(options)):
        msg = (
            f"rollout_rs_threshold: {len(specs)} thresholds for {len(options)} rollout_rs "
            "options; give one for all or one per option"
        )
        raise ValueError(msg)
    specs = specs * len(options) if len(specs) == 1 else specs
    bounds: dict[str, tuple[float, float]] = {}
    for option, spec in zip(options, specs):
        try:
            if option.endswith("k1"):
                low, _, high = spec.rpartition("_")
                upper = float(high)
                lower = float(low) if low else 1.0 / upper
            elif "_" in spec:
                msg = f"rollout_rs_threshold {spec!r} for {option}: one upper bound, no '_'"
                raise ValueError(msg)
            else:
                upper, lower = float(spec), 0.0
        except (ValueError, ZeroDivisionError) as err:
            msg = (
                str(err)
                if "rollout_rs_threshold" in str(err)
                else (
                    f"rollout_rs_threshold {spec!r} for {option} is not a number (or lower_upper)"
                )
            )
            raise ValueError(msg) from None
        if upper <= 0 or (option.endswith("k1") and (lower <= 0 or lower > upper)):
            msg = f"rollout_rs_threshold {spec!r} for {option}: bounds must be 0 < lower <= upper"
            raise ValueError(msg)
        bounds[option] = (lower, upper)
    return bounds


@torch.no_grad()
def rollout_rs_mask(
    old_log_prob: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_rs: str,
    threshold: str | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the rejected tokens set to 0, and verl's masked fractions.

    verl's ``compute_rollout_rejection_mask`` (``rollout_corr_helper.py``): every option must
    pass; metrics ``rollout_rs_<option>_masked_fraction`` (tokens),
    ``rollout_rs_<option>_seq_masked_fraction`` (rows losing a token), and the same for all
    options together (``rollout_rs_masked_fraction``, ``rollout_rs_seq_masked_fraction``).
    """
    bounds = parse_rollout_rs(rollout_rs, threshold)
    valid = response_mask.bool()
    log_ratio = (old_log_prob - rollout_log_probs.to(old_log_prob.dtype)).clamp(
        -_SAFETY_BOUND, _SAFETY_BOUND
    )
    stats = {
        "k1": -log_ratio,
        "k2": 0.5 * log_ratio**2,
        "k3": torch.exp(log_ratio) - 1.0 - log_ratio,
    }
    keep = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in bounds.items():
        kind = option[-2:]
        stat = stats[kind]
        if option.startswith("seq_sum"):
            stat = masked_sum(stat, response_mask, dim=-1).unsqueeze(-1)
        elif option.startswith("seq_mean"):
            stat = masked_mean(stat, response_mask, dim=-1).unsqueeze(-1)
        elif option.startswith("seq_max"):
            stat = stat.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
        if kind == "k1":  # a log ratio against log bounds: two-sided
            passes = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            passes = stat <= upper
        passes = passes.expand_as(valid)
        keep &= passes
        metrics.update(_rs_fractions(f"rollout_rs_{option}", passes, valid))
    metrics.update(_rs_fractions("rollout_rs", keep, valid))
    return response_mask * keep.to(response_mask.dtype), metrics


def _rs_fractions(prefix: str, keep: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Masked fraction of the valid tokens and of the rows with any valid token."""
    dropped = ~keep & valid
    rows = valid.any(-1)
    token_frac = float(dropped.sum()) / max(int(valid.sum()), 1)
    seq_frac = float((dropped.any(-1) & rows).sum()) / max(int(rows.sum()), 1)
    return {
        f"actor/{prefix}_masked_fraction": token_frac,
        f"actor/{prefix}_seq_masked_fraction": seq_frac,
    }
