"""KL estimators between the policy and the reference, KL controllers, and the KL reward penalty.

Estimators of KL(pi || pi_ref) per token from ``delta = log pi - log pi_ref`` (J. Schulman,
"Approximating KL divergence", 2020), as verl's ``kl_penalty``:

- ``k1`` / ``kl``: ``delta``; ``abs``: ``|delta|``; ``k2`` / ``mse``: ``0.5 * delta**2``;
- ``k3`` / ``low_var_kl``: ``exp(-delta) + delta - 1``, with ``-delta`` clamped to [-20, 20]
  before ``exp`` and the result clamped to [-10, 10] (verl's numerical guards).
- a ``+`` suffix (``k3+``, ``low_var_kl+``, ``k1+``, ``abs+``): the value of the estimator
  with the gradient of ``k2``, by straight-through: ``k2 - k2.detach() + value.detach()``.
  k1 and k3 have the right expected value but not the right expected gradient; k2's gradient
  is the unbiased one. ``k2+`` is plain ``k2``.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from rlcore.rl.masked import apply_mask, masked_mean

__all__ = ["KL_ESTIMATORS", "KLController", "apply_kl_penalty", "kl_penalty"]

_BASE_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
#: Every accepted estimator name, for config validation.
KL_ESTIMATORS: tuple[str, ...] = _BASE_ESTIMATORS + tuple(f"{n}+" for n in _BASE_ESTIMATORS)


def _kl_value(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, name: str) -> torch.Tensor:
    if name in ("kl", "k1"):
        return log_prob - ref_log_prob
    if name == "abs":
        return (log_prob - ref_log_prob).abs()
    if name in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if name in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    msg = f"unknown KL estimator {name!r}; expected one of {', '.join(KL_ESTIMATORS)}"
    raise ValueError(msg)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate (B, R); see the module docstring for the estimators."""
    base = estimator.removesuffix("+")
    value = _kl_value(log_prob, ref_log_prob, base)
    if not estimator.endswith("+") or base in ("mse", "k2"):
        return value
    k2 = 0.5 * (log_prob - ref_log_prob).square()
    return k2 - k2.detach() + value.detach()


@attrs.define(kw_only=True)
class KLController:
    """The coefficient of the KL penalty in the reward: fixed, or adaptive (Ziegler et al. 2019).

    Adaptive: after each batch, ``coef *= 1 + clip(kl / target_kl - 1, -0.2, 0.2) * n / horizon``
    with ``n`` the batch's number of rows, as verl's ``AdaptiveKLController``, then clamped at
    0: when one update covers more than 5x the horizon (``n > 5 * horizon``) and the KL is
    below target, the factor is negative and verl's coefficient turns negative (a reward for
    moving *away* from the reference). Here it stops at 0 instead, and stays there: a
    multiplicative controller cannot climb back from 0, so keep ``horizon`` well above the
    batch size (verl's default 10000 rows). This is run
    state: it lives on the driver only (the algorithm instance there holds it) and is saved
    with the trainer's checkpoint through :meth:`state_dict`.
    """

    value: float
    adaptive: bool = False
    target_kl: float = 0.1
    horizon: int = 10000

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward ``target_kl`` (no-op when fixed)."""
        if not self.adaptive:
            return
        error = float(np.clip(current_kl / self.target_kl - 1.0, -0.2, 0.2))
        self.value = max(0.0, self.value * (1.0 + error * n_steps / self.horizon))

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    coef: float,
    estimator: str = "kl",
) -> tuple[torch.Tensor, float]:
    """``rewards = scores - coef * KL`` per valid token; returns (rewards (B, R), current KL).

    The current KL, fed to the adaptive controller, is the mean over rows of each row's
    token-mean KL (verl's ``apply_kl_penalty``).
    """
    kld = kl_penalty(old_log_probs, ref_log_prob, estimator).to(token_level_scores.dtype)
    kld = apply_mask(kld, response_mask)
    rewards = token_level_scores - coef * kld
    current_kl = float(masked_mean(kld, response_mask, dim=-1).mean()) if kld.shape[0] else 0.0
    return rewards, current_kl
