"""``PolicyGradientAlgorithm``: the options and losses PPO, GRPO, RLOO and REINFORCE++ share.

A plugin subclasses it, re-applies ``@attrs.frozen(kw_only=True)`` on its own ``Config``, and
implements :meth:`compute_advantages` with an estimator from :mod:`rlcore.rl.advantages`.
The policy loss, the KL loss / KL-in-reward and the entropy bonus come from here::

    class GRPO(PolicyGradientAlgorithm):
        @attrs.frozen(kw_only=True)
        class Config(PolicyGradientAlgorithm.Config):
            norm_adv_by_std: bool = True

        def compute_advantages(self, batch): ...

Run state: the KL-in-reward controller (:attr:`kl_ctrl`) is the only state, and it is used
on the driver only (:meth:`compute_rewards` reads and updates it); workers rebuild the
algorithm from its ``Config`` and never touch it. The trainer saves it with
:meth:`state_dict` / :meth:`load_state_dict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs
import torch

from rlcore.interfaces import BaseAlgorithm, BatchTotals, ModelOutputs
from rlcore.rl.kl import KL_ESTIMATORS, KLController, apply_kl_penalty, kl_penalty
from rlcore.rl.losses import (
    LOSS_AGG_MODES,
    LossAggMode,
    agg_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_gmpo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from rlcore.rl.rollout_is import (
    ROLLOUT_IS_LEVELS,
    RolloutIS,
    rollout_is_metrics,
    rollout_is_weights,
)

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = ["POLICY_LOSSES", "KLControlConfig", "PolicyGradientAlgorithm", "require"]

_v = attrs.validators

PolicyLoss = Literal["vanilla", "gspo", "cispo", "gpg", "sapo", "gmpo", "kl_cov"]
POLICY_LOSSES: tuple[str, ...] = ("vanilla", "gspo", "cispo", "gpg", "sapo", "gmpo", "kl_cov")


@attrs.frozen(kw_only=True)
class KLControlConfig:
    """The KL-in-reward coefficient (``[algorithm.kl_ctrl]``), used when ``use_kl_in_reward``.

    ``fixed`` keeps ``kl_coef``; ``adaptive`` moves it toward ``target_kl`` over ``horizon``
    rows (see :class:`rlcore.rl.kl.KLController`).
    """

    type: Literal["fixed", "adaptive"] = attrs.field(
        default="fixed", validator=_v.in_(("fixed", "adaptive"))
    )
    kl_coef: float = attrs.field(default=0.001, validator=_v.ge(0.0))
    target_kl: float = attrs.field(default=0.1, validator=_v.gt(0.0))
    horizon: int = attrs.field(default=10000, validator=_v.gt(0))


def require(batch: DataProto, key: str) -> torch.Tensor:
    """``batch.batch[key]``, or a KeyError naming what the algorithm needed."""
    tensors = batch.batch or {}
    if key not in tensors:
        msg = f"the algorithm needs batch[{key!r}]; the batch has {sorted(tensors)}"
        raise KeyError(msg)
    return tensors[key]


def _local_metric(value: torch.Tensor, mode: str, totals: BatchTotals, mask: torch.Tensor) -> float:
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


class PolicyGradientAlgorithm(BaseAlgorithm):
    """Clipped policy-gradient loss with optional KL (loss or reward) and entropy bonus."""

    @attrs.frozen(kw_only=True)
    class Config(BaseAlgorithm.Config):
        """Options every policy-gradient algorithm accepts (``[algorithm]``).

        - ``clip_ratio_low`` / ``clip_ratio_high``: PPO clip range ``[1 - low, 1 + high]``
          (DAPO's clip-higher raises ``high``, e.g. 0.28).
        - ``clip_ratio_c``: dual-clip bound for negative advantages (> 1).
        - ``loss_agg_mode``: ``token-mean`` | ``token-sum`` | ``seq-mean-token-sum`` |
          ``seq-mean-token-mean`` | ``seq-mean-token-sum-norm`` (see :mod:`rlcore.rl.losses`).
        - ``policy_loss``: ``vanilla`` (token ratio, PPO), ``gspo`` (sequence ratio),
          ``cispo`` (clipped, detached IS weight times log-prob), ``gpg`` (``-A * log pi``),
          ``sapo`` (smooth gate, ``sapo_tau_pos`` / ``sapo_tau_neg``), ``gmpo`` (geometric
          mean of the token ratios; ``clip_ratio_low``/``high`` are then log-space bounds and
          ``loss_agg_mode`` does not apply), ``kl_cov`` (KL penalty on the ``kl_cov_ratio``
          highest-covariance tokens, ``ppo_kl_coef``). See :mod:`rlcore.rl.losses`.
        - ``rollout_is``: ``none`` | ``token`` | ``sequence``: truncated importance weights
          ``min(pi_old / pi_rollout, rollout_is_cap)`` on the policy loss, from the batch's
          ``rollout_log_probs`` (vLLM/SGLang rollouts; :mod:`rlcore.rl.rollout_is`).
        - ``use_kl_loss`` / ``kl_loss_coef`` / ``kl_loss_type``: KL to the reference as a loss
          term (GRPO's way); ``kl_loss_type`` one of k1/kl, abs, k2/mse, k3/low_var_kl, each
          optionally with ``+`` (value of the estimator, gradient of k2).
        - ``use_kl_in_reward`` / ``kl_penalty`` / ``kl_ctrl``: KL as a per-token penalty in
          the reward (PPO's way), with a fixed or adaptive coefficient.
        - ``entropy_coeff``: entropy bonus (``loss -= entropy_coeff * entropy``).
        """

        clip_ratio_low: float = attrs.field(default=0.2, validator=[_v.ge(0.0), _v.lt(1.0)])
        clip_ratio_high: float = attrs.field(default=0.2, validator=_v.ge(0.0))
        clip_ratio_c: float = attrs.field(default=3.0, validator=_v.gt(1.0))
        loss_agg_mode: LossAggMode = attrs.field(
            default="token-mean", validator=_v.in_(LOSS_AGG_MODES)
        )
        policy_loss: PolicyLoss = attrs.field(default="vanilla", validator=_v.in_(POLICY_LOSSES))
        sapo_tau_pos: float = attrs.field(default=1.0, validator=_v.gt(0.0))
        sapo_tau_neg: float = attrs.field(default=1.05, validator=_v.gt(0.0))
        kl_cov_ratio: float = attrs.field(default=0.0002, validator=[_v.gt(0.0), _v.le(1.0)])
        ppo_kl_coef: float = attrs.field(default=1.0, validator=_v.ge(0.0))
        rollout_is: RolloutIS = attrs.field(default="none", validator=_v.in_(ROLLOUT_IS_LEVELS))
        rollout_is_cap: float = attrs.field(default=2.0, validator=_v.gt(0.0))
        use_kl_loss: bool = False
        kl_loss_coef: float = attrs.field(default=0.001, validator=_v.ge(0.0))
        kl_loss_type: str = attrs.field(default="low_var_kl", validator=_v.in_(KL_ESTIMATORS))
        use_kl_in_reward: bool = False
        kl_penalty: str = attrs.field(default="kl", validator=_v.in_(KL_ESTIMATORS))
        kl_ctrl: KLControlConfig = attrs.field(factory=KLControlConfig)
        entropy_coeff: float = 0.0

    config: PolicyGradientAlgorithm.Config

    def __init__(self, config: PolicyGradientAlgorithm.Config | None = None) -> None:
        super().__init__(config)
        ctrl = self.config.kl_ctrl
        # Driver-side run state (see the module docstring).
        self.kl_ctrl = KLController(
            value=ctrl.kl_coef,
            adaptive=ctrl.type == "adaptive",
            target_kl=ctrl.target_kl,
            horizon=ctrl.horizon,
        )

    @property
    def needs_reference(self) -> bool:
        return self.config.use_kl_loss or self.config.use_kl_in_reward

    @property
    def needs_entropy(self) -> bool:
        """Whether the engine must return ``outputs.entropy`` with gradient for the loss."""
        return self.config.entropy_coeff != 0.0

    @property
    def needs_rollout_log_probs(self) -> bool:
        """Whether the policy loss reads ``rollout_log_probs`` (``rollout_is`` is set)."""
        return self.config.rollout_is != "none"

    @property
    def needs_old_log_probs_on_driver(self) -> bool:
        """Whether :meth:`compute_rewards` reads ``old_log_probs`` (KL in the reward).

        When not, and the update is on-policy, the worker takes them from the training
        forward instead of a separate pass (:mod:`rlcore.trainer.levers`).
        """
        return self.config.use_kl_in_reward

    @property
    def zero_advantage_rows_inert(self) -> bool:
        """Whether a row whose advantages are all zero adds nothing to the loss's gradient.

        True without a KL loss or entropy bonus: every remaining term (vanilla or GSPO
        clipped PG, dual clip included) is a multiple of the advantage, so the worker may
        leave such rows out of the backward pass (the mini-batch totals keep them).
        """
        return not self.config.use_kl_loss and not self.needs_entropy

    # --- driver side ------------------------------------------------------------------------

    def compute_rewards(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        """``token_level_rewards = token_level_scores - coef * KL(old || ref)`` when
        ``use_kl_in_reward``, else a copy of the scores; updates the adaptive coefficient."""
        scores = require(batch, "token_level_scores")
        if not self.config.use_kl_in_reward:
            batch.batch["token_level_rewards"] = scores
            return batch, {}
        coef = self.kl_ctrl.value
        rewards, current_kl = apply_kl_penalty(
            scores,
            require(batch, "old_log_probs"),
            require(batch, "ref_log_prob"),
            require(batch, "response_mask"),
            coef=coef,
            estimator=self.config.kl_penalty,
        )
        batch.batch["token_level_rewards"] = rewards
        self.kl_ctrl.update(current_kl, n_steps=int(scores.shape[0]))
        return batch, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": coef}

    def state_dict(self) -> dict[str, float]:
        """Driver run state for checkpoints: the KL-in-reward coefficient."""
        return {"kl_coef": self.kl_ctrl.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.kl_ctrl.value = float(state["kl_coef"])

    # --- inside the engines -----------------------------------------------------------------

    def policy_loss(
        self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped PG loss (+ ``kl_loss_coef`` * KL loss, - ``entropy_coeff`` * entropy).

        Every term is aggregated with ``loss_agg_mode`` over the mini-batch ``totals``.
        Metrics are this micro-batch's own means.
        """
        cfg = self.config
        if outputs.log_probs is None:
            msg = "policy_loss needs outputs.log_probs (with gradient)"
            raise ValueError(msg)
        log_prob = outputs.log_probs  # (b, R)
        mask = require(batch, "response_mask")
        old_log_prob = require(batch, "old_log_probs").to(log_prob.dtype)
        advantages = require(batch, "advantages").to(log_prob.dtype)
        mode = cfg.loss_agg_mode
        weights = None
        is_metrics: dict[str, float] = {}
        if cfg.rollout_is != "none":
            weights = rollout_is_weights(
                old_log_prob, require(batch, "rollout_log_probs").to(log_prob.dtype), mask,
                level=cfg.rollout_is, cap=cfg.rollout_is_cap,
            )  # fmt: skip
            is_metrics = rollout_is_metrics(weights, mask, cfg.rollout_is_cap)
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = self._pg_loss(
            old_log_prob, log_prob, advantages, mask, totals, weights
        )
        if cfg.policy_loss == "gmpo":
            mode = "seq-mean-token-sum"  # a per-row loss over totals.sequences, for metrics
        loss = pg_loss
        metrics = {
            "actor/pg_loss": _local_metric(pg_loss, mode, totals, mask),
            "actor/pg_clipfrac": float(clipfrac.item()),
            "actor/pg_clipfrac_lower": float(clipfrac_lower.item()),
            "actor/ppo_kl": float(ppo_kl.item()),
            **is_metrics,
        }
        mode = cfg.loss_agg_mode
        if outputs.entropy is not None:
            entropy = agg_loss(outputs.entropy, mask, mode, totals)
            metrics["actor/entropy"] = _local_metric(entropy, mode, totals, mask)
            if self.needs_entropy:
                loss = loss - cfg.entropy_coeff * entropy
        elif self.needs_entropy:
            msg = f"entropy_coeff={cfg.entropy_coeff} needs outputs.entropy (with gradient)"
            raise ValueError(msg)
        if cfg.use_kl_loss:
            ref_log_prob = require(batch, "ref_log_prob").to(log_prob.dtype)
            kld = kl_penalty(log_prob, ref_log_prob, cfg.kl_loss_type)  # (b, R)
            kl_loss = agg_loss(kld, mask, mode, totals)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = _local_metric(kl_loss, mode, totals, mask)
            metrics["actor/kl_coef"] = cfg.kl_loss_coef
        return loss, metrics

    def _pg_loss(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        totals: BatchTotals,
        weights: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The configured policy loss: (loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
        cfg = self.config
        old, new, adv = old_log_prob, log_prob, advantages
        low, high, mode = cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.loss_agg_mode
        if cfg.policy_loss == "gspo":
            return compute_policy_loss_gspo(
                old, new, adv, mask, clip_ratio_low=low, clip_ratio_high=high,
                loss_agg_mode=mode, totals=totals, rollout_is_weights=weights,
            )  # fmt: skip
        if cfg.policy_loss == "cispo":
            return compute_policy_loss_cispo(
                old, new, adv, mask, clip_ratio_low=low, clip_ratio_high=high,
                loss_agg_mode=mode, totals=totals, rollout_is_weights=weights,
            )  # fmt: skip
        if cfg.policy_loss == "gpg":
            return compute_policy_loss_gpg(
                old, new, adv, mask, loss_agg_mode=mode, totals=totals, rollout_is_weights=weights
            )
        if cfg.policy_loss == "sapo":
            return compute_policy_loss_sapo(
                old, new, adv, mask, tau_pos=cfg.sapo_tau_pos, tau_neg=cfg.sapo_tau_neg,
                loss_agg_mode=mode, totals=totals, rollout_is_weights=weights,
            )  # fmt: skip
        if cfg.policy_loss == "kl_cov":
            return compute_policy_loss_kl_cov(
                old, new, adv, mask, kl_cov_ratio=cfg.kl_cov_ratio, ppo_kl_coef=cfg.ppo_kl_coef,
                loss_agg_mode=mode, totals=totals, rollout_is_weights=weights,
            )  # fmt: skip
        if cfg.policy_loss == "gmpo":
            return compute_policy_loss_gmpo(
                old, new, adv, mask, clip_ratio_low=low, clip_ratio_high=high,
                totals=totals, rollout_is_weights=weights,
            )  # fmt: skip
        return compute_policy_loss_vanilla(
            old, new, adv, mask, clip_ratio_low=low, clip_ratio_high=high,
            clip_ratio_c=cfg.clip_ratio_c, loss_agg_mode=mode, totals=totals,
            rollout_is_weights=weights,
        )  # fmt: skip
