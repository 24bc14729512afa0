"""``PolicyGradientAlgorithm``: the options and losses PPO, GRPO, RLOO and REINFORCE++ share.

A plugin subclasses it and re-applies ``@attrs.frozen(kw_only=True)`` on its own ``Config``,
giving ``adv_estimator`` its default and the options that estimator reads, declared with
the estimator (``rlcore.rl.advantages.GRPOOptions``; or it overrides
:meth:`compute_advantages`). The advantage estimator and the policy loss are looked up by
name in :mod:`rlcore.rl.registry` (``[algorithm] adv_estimator`` / ``policy_loss``); the KL
loss / KL-in-reward and the entropy bonus come from here::

    class GRPO(PolicyGradientAlgorithm):
        @attrs.frozen(kw_only=True)
        class Config(PolicyGradientAlgorithm.Config, GRPOOptions):  # the estimator's options
            adv_estimator: str | None = adv_estimator_key("grpo", "The advantage estimator.")

Run state: the KL-in-reward controller (:attr:`kl_ctrl`) is the only state, and it is used
on the driver only (:meth:`compute_rewards` reads and updates it); workers rebuild the
algorithm from its ``Config`` and never touch it. The trainer saves it with
:meth:`state_dict` / :meth:`load_state_dict`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs
import torch

from rlcore import builtin
from rlcore.errors import PluginError
from rlcore.interfaces import BaseAlgorithm, BatchTotals, ModelOutputs, key
from rlcore.rl.advantages import estimator_options
from rlcore.rl.kl import KL_ESTIMATORS, KLController, apply_kl_penalty, kl_penalty
from rlcore.rl.losses import (
    LOSS_AGG_MODES,
    LossAggMode,
    agg_loss,
    is_advantage_scaled,
    local_metric,
)
from rlcore.rl.registry import get_adv_estimator_fn, get_policy_loss_fn
from rlcore.rl.rollout_is import (
    ROLLOUT_IS_LEVELS,
    RolloutIS,
    parse_rollout_rs,
    rollout_is_metrics,
    rollout_is_weights,
    rollout_rs_mask,
)

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = [
    "POLICY_LOSSES",
    "KLControlConfig",
    "PolicyGradientAlgorithm",
    "adv_estimator_key",
    "adv_estimator_name",
    "policy_loss_name",
    "require",
]

_v = attrs.validators

# The core's own policy losses (registered in rlcore.builtin; plugins may add more).
POLICY_LOSSES: tuple[str, ...] = tuple(builtin.register_policy_losses())


def policy_loss_name(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    """attrs validator: ``value`` is a registered policy loss (imported, so a broken plugin
    module is reported when the config is loaded, not in a worker)."""
    try:
        get_policy_loss_fn(value)
    except PluginError as err:
        raise ValueError(str(err)) from err


def adv_estimator_name(instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """attrs validator: ``value`` is a registered advantage estimator whose options
    (:func:`~rlcore.rl.advantages.estimator_options`) this algorithm's ``Config`` has; None:
    the algorithm computes its own."""
    if value is None:
        return
    try:
        estimator = get_adv_estimator_fn(value)
    except PluginError as err:
        raise ValueError(str(err)) from err
    fields = attrs.fields_dict(type(instance))
    missing = [k for k in estimator_options(estimator) if k not in fields]
    if missing:
        algorithm = type(instance).__qualname__.removesuffix(".Config")
        msg = (
            f"advantage estimator {value!r} reads the options {', '.join(missing)}, "
            f"which algorithm {algorithm} does not have"
        )
        raise ValueError(msg)


def adv_estimator_key(default: str | None, help: str) -> Any:
    """An algorithm's ``adv_estimator`` key: its default estimator and help text, checked by
    :func:`adv_estimator_name` (registered, and its options present in the ``Config``)."""
    return key(default, help, validator=adv_estimator_name)


@attrs.frozen(kw_only=True)
class KLControlConfig:
    """The KL-in-reward coefficient (``[algorithm.kl_ctrl]``), used when ``use_kl_in_reward``.

    ``fixed`` keeps ``kl_coef``; ``adaptive`` moves it toward ``target_kl`` over ``horizon``
    rows (see :class:`rlcore.rl.kl.KLController`).
    """

    type: Literal["fixed", "adaptive"] = key(
        "fixed",
        "fixed keeps kl_coef; adaptive moves it toward target_kl over horizon rows.",
        validator=_v.in_(("fixed", "adaptive")),
    )
    kl_coef: float = key(
        0.001,
        "Coefficient of the KL penalty in the reward (the starting value when adaptive).",
        validator=_v.ge(0.0),
    )
    target_kl: float = key(0.1, "KL the adaptive controller steers toward.", validator=_v.gt(0.0))
    horizon: int = key(
        10000,
        "Rows over which the adaptive controller moves the coefficient; keep it "
        "well above a step's rows.",
        validator=_v.gt(0),
    )


def require(batch: DataProto, key: str) -> torch.Tensor:
    """``batch.batch[key]``, or a KeyError naming what the algorithm needed."""
    tensors = batch.batch or {}
    if key not in tensors:
        msg = f"the algorithm needs batch[{key!r}]; the batch has {sorted(tensors)}"
        raise KeyError(msg)
    return tensors[key]


class PolicyGradientAlgorithm(BaseAlgorithm):
    """The registered policy loss and advantage estimator, with optional KL (loss or reward)
    and entropy bonus."""

    @attrs.frozen(kw_only=True)
    class Config(BaseAlgorithm.Config):
        """Options every policy-gradient algorithm accepts (``[algorithm]``).

        - ``clip_ratio_low`` / ``clip_ratio_high``: PPO clip range ``[1 - low, 1 + high]``
          (DAPO's clip-higher raises ``high``, e.g. 0.28).
        - ``clip_ratio_c``: dual-clip bound for negative advantages (> 1).
        - ``loss_agg_mode``: ``token-mean`` | ``token-sum`` | ``seq-mean-token-sum`` |
          ``seq-mean-token-mean`` | ``seq-mean-token-sum-norm`` (see :mod:`rlcore.rl.losses`).
        - ``policy_loss``: a name in :mod:`rlcore.rl.registry` (plugins may add more):
          ``vanilla`` (token ratio, PPO), ``gspo`` (sequence ratio),
          ``cispo`` (clipped, detached IS weight times log-prob), ``gpg`` (``-A * log pi``),
          ``sapo`` (smooth gate, ``sapo_tau_pos`` / ``sapo_tau_neg``), ``gmpo`` (geometric
          mean of the token ratios; ``clip_ratio_low``/``high`` are then log-space bounds and
          ``loss_agg_mode`` does not apply), ``kl_cov`` (KL penalty on the ``kl_cov_ratio``
          highest-covariance tokens, ``ppo_kl_coef``). See :mod:`rlcore.rl.losses`.
        - ``adv_estimator`` (verl's key): the advantage estimator, by name in
          :mod:`rlcore.rl.registry` (``gae``, ``grpo``, ``rloo``, ``reinforce_plus_plus``,
          ``reinforce_plus_plus_baseline``, or a plugin's); each algorithm sets its default,
          and accepts those whose options it has (``gae`` reads ``gamma``/``lam``: PPO).
        - ``rollout_is``: ``none`` | ``token`` | ``sequence``: truncated importance weights
          ``min(pi_old / pi_rollout, rollout_is_cap)`` on the policy loss, from the batch's
          ``rollout_log_probs`` (vLLM/SGLang rollouts; :mod:`rlcore.rl.rollout_is`). Left
          unset, the loader makes it ``token`` in the asynchronous modes (their samples are
          one or more weight versions old; docs/placement.md) and where the rollout engine's
          ``dtype`` is not ``model.dtype`` (a bfloat16 vLLM for a float32 policy).
          ``rollout_is_threshold_lower`` set: IcePop's band instead of the truncation (a weight
          outside ``[rollout_is_threshold_lower, rollout_is_cap]`` is 0, verl's
          ``rollout_is_threshold = "lower_upper"``).
        - ``rollout_rs`` / ``rollout_rs_threshold``: verl's rejection masks (masked importance
          sampling): tokens or whole sequences whose ``pi_old`` / ``pi_rollout`` divergence
          leaves the threshold are taken out of ``response_mask`` on the driver, before the
          update (:func:`rlcore.rl.rollout_is.rollout_rs_mask`).
        - ``use_kl_loss`` / ``kl_loss_coef`` / ``kl_loss_type``: KL to the reference as a loss
          term (GRPO's way); ``kl_loss_type`` one of k1/kl, abs, k2/mse, k3/low_var_kl, each
          optionally with ``+`` (value of the estimator, gradient of k2).
        - ``use_kl_in_reward`` / ``kl_penalty`` / ``kl_ctrl``: KL as a per-token penalty in
          the reward (PPO's way), with a fixed or adaptive coefficient.
        - ``entropy_coeff``: entropy bonus (``loss -= entropy_coeff * entropy``).
        """

        clip_ratio_low: float = key(
            0.2,
            "PPO clip range lower side: the ratio is clipped to [1 - "
            "clip_ratio_low, 1 + clip_ratio_high].",
            validator=[_v.ge(0.0), _v.lt(1.0)],
        )
        clip_ratio_high: float = key(
            0.2,
            "PPO clip range upper side (DAPO's clip-higher raises it, e.g. 0.28).",
            validator=_v.ge(0.0),
        )
        clip_ratio_c: float = key(
            3.0,
            "Dual-clip bound for negative advantages: the loss is at most -A * clip_ratio_c.",
            validator=_v.gt(1.0),
        )
        loss_agg_mode: LossAggMode = key(
            "token-mean",
            "How token losses become the mini-batch loss (rlcore.rl.losses): mean "
            "over tokens, sum, or per-sequence then mean.",
            validator=_v.in_(LOSS_AGG_MODES),
        )
        policy_loss: str = key(
            "vanilla",
            "The policy loss by name (vanilla: PPO token ratio; gspo, cispo, gpg, "
            "sapo, gmpo, kl_cov; plugins may add more).",
            validator=policy_loss_name,
        )
        adv_estimator: str | None = adv_estimator_key(
            None,
            "The advantage estimator by name (gae, grpo, rloo, reinforce_plus_plus, "
            "reinforce_plus_plus_baseline, or a plugin's); the algorithm must have "
            "the options it reads.",
        )
        sapo_tau_pos: float = key(
            1.0, "sapo policy loss: gate temperature for positive advantages.", validator=_v.gt(0.0)
        )
        sapo_tau_neg: float = key(
            1.05,
            "sapo policy loss: gate temperature for negative advantages.",
            validator=_v.gt(0.0),
        )
        kl_cov_ratio: float = key(
            0.0002,
            "kl_cov policy loss: fraction of tokens (highest covariance) that get the KL penalty.",
            validator=[_v.gt(0.0), _v.le(1.0)],
        )
        ppo_kl_coef: float = key(
            1.0, "kl_cov policy loss: coefficient of that KL penalty.", validator=_v.ge(0.0)
        )
        rollout_is: RolloutIS = key(
            "none",
            "Truncated importance weights min(pi_old / pi_rollout, rollout_is_cap) "
            "on the policy loss, per token or per sequence, from the rollout's "
            "log-probs; none: off. Left unset with trainer.async_mode one_step_off or "
            "fully_async, or a rollout dtype other than model.dtype: token.",
            validator=_v.in_(ROLLOUT_IS_LEVELS),
        )
        rollout_is_cap: float = key(
            2.0, "Upper bound of the rollout importance weights.", validator=_v.gt(0.0)
        )
        rollout_is_threshold_lower: float | None = key(
            None,
            "IcePop: a rollout importance weight outside [rollout_is_threshold_lower, "
            "rollout_is_cap] is set to 0 (the token is dropped) instead of clipped at the cap "
            '(verl\'s rollout_is_threshold = "lower_upper"); unset: truncation (TIS).',
            allowed="in (0, rollout_is_cap] (or unset)",
        )
        rollout_rs: str = key(
            "none",
            "Rejection masks (verl's rollout_rs): comma-separated token_k1|k2|k3, "
            "seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3; a token or sequence whose "
            "divergence between the rollout's and the old policy's log-probs (k1: log ratio, "
            "two-sided; k2, k3: upper bound) leaves rollout_rs_threshold is masked out of "
            "the update; none: off.",
        )
        rollout_rs_threshold: str | None = key(
            None,
            'verl\'s rollout_rs_threshold, as a string: "lower_upper" ratio bounds for k1 '
            'options (e.g. "0.5_2.0"; one number u means 1/u_u), one upper bound for the '
            "others; one for all options or one per option, comma-separated.",
        )
        use_kl_loss: bool = key(
            False,
            "Add KL to the reference policy as a loss term (GRPO's way; needs the reference).",
        )
        kl_loss_coef: float = key(0.001, "Coefficient of the KL loss.", validator=_v.ge(0.0))
        kl_loss_type: str = key(
            "low_var_kl",
            "KL estimator of the KL loss (k1/kl, abs, k2/mse, k3/low_var_kl; a "
            "trailing + takes the gradient of k2).",
            validator=_v.in_(KL_ESTIMATORS),
        )
        use_kl_in_reward: bool = key(
            False,
            "Subtract a per-token KL penalty to the reference from the reward "
            "(PPO's way; needs the reference).",
        )
        kl_penalty: str = key(
            "kl", "KL estimator of the penalty in the reward.", validator=_v.in_(KL_ESTIMATORS)
        )
        kl_ctrl: KLControlConfig = attrs.field(factory=KLControlConfig)
        entropy_coeff: float = key(0.0, "Entropy bonus: loss -= entropy_coeff * entropy; 0: off.")

        def __attrs_post_init__(self) -> None:
            lower = self.rollout_is_threshold_lower
            if lower is not None and not 0 < lower <= self.rollout_is_cap:
                msg = (
                    f"rollout_is_threshold_lower must be in (0, rollout_is_cap="
                    f"{self.rollout_is_cap}], got {lower}"
                )
                raise ValueError(msg)
            if self.rollout_rs != "none":
                parse_rollout_rs(self.rollout_rs, self.rollout_rs_threshold)

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
        """Whether the policy loss reads ``rollout_log_probs`` (``rollout_is`` is set) or the
        driver masks by them (``rollout_rs``)."""
        return self.config.rollout_is != "none" or self.config.rollout_rs != "none"

    @property
    def needs_old_log_probs_on_driver(self) -> bool:
        """Whether :meth:`compute_rewards` reads ``old_log_probs`` (KL in the reward).

        When not, and the update is on-policy, the worker takes them from the training
        forward instead of a separate pass (:mod:`rlcore.roles.levers`).
        """
        return self.config.use_kl_in_reward or self.config.rollout_rs != "none"

    @property
    def zero_advantage_rows_inert(self) -> bool:
        """Whether a row whose advantages are all zero adds nothing to the loss's gradient.

        True without a KL loss or entropy bonus and with a policy loss marked
        :func:`~rlcore.rl.losses.advantage_scaled` (every term a multiple of the advantage), so
        the worker may leave such rows out of the backward pass (the mini-batch totals keep
        them). ``kl_cov`` is not marked (its penalty does not vanish with the advantage, and
        its token selection depends on the rows present); nor is an unknown name.
        """
        if self.config.use_kl_loss or self.needs_entropy:
            return False
        try:
            loss = get_policy_loss_fn(self.config.policy_loss)
        except PluginError:  # validated when the config loads; unknown here: keep every row
            return False
        return is_advantage_scaled(loss)

    # --- driver side ------------------------------------------------------------------------

    def compute_advantages(self, batch: DataProto) -> DataProto:
        """``advantages`` and ``returns`` from the ``adv_estimator`` named in the Config."""
        name = self.config.adv_estimator
        if name is None:
            msg = f"{type(self).__name__} names no adv_estimator and does not compute advantages"
            raise NotImplementedError(msg)
        estimator = get_adv_estimator_fn(name, where="[algorithm] adv_estimator")
        tensors = batch.batch or {}
        advantages, returns = estimator(
            require(batch, "token_level_rewards"),
            require(batch, "response_mask"),
            config=self.config,
            index=batch.non_tensor_batch.get("uid"),
            values=tensors.get("values"),
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch

    def compute_rewards(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        """``token_level_rewards = token_level_scores - coef * KL(old || ref)`` when
        ``use_kl_in_reward``, else a copy of the scores; updates the adaptive coefficient."""
        scores = require(batch, "token_level_scores")
        rs_metrics: dict[str, float] = {}
        if self.config.rollout_rs != "none":
            # verl masks before the update (compute_rollout_correction_and_add_to_batch): the
            # rejected tokens leave the loss and its token and sequence counts alike.
            batch.batch["response_mask"], rs_metrics = rollout_rs_mask(
                require(batch, "old_log_probs"),
                require(batch, "rollout_log_probs"),
                require(batch, "response_mask"),
                rollout_rs=self.config.rollout_rs,
                threshold=self.config.rollout_rs_threshold,
            )
        if not self.config.use_kl_in_reward:
            batch.batch["token_level_rewards"] = scores
            return batch, rs_metrics
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
        return batch, {
            **rs_metrics,
            "actor/reward_kl_penalty": current_kl,
            "actor/reward_kl_penalty_coeff": coef,
        }

    def state_dict(self) -> dict[str, float]:
        """Driver run state for checkpoints: the KL-in-reward coefficient."""
        return {"kl_coef": self.kl_ctrl.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.kl_ctrl.value = float(state["kl_coef"])

    # --- inside the engines -----------------------------------------------------------------

    def policy_loss(
        self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The ``policy_loss`` (+ ``kl_loss_coef`` * KL loss, - ``entropy_coeff`` * entropy).

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
            lower = cfg.rollout_is_threshold_lower
            weights = rollout_is_weights(
                old_log_prob, require(batch, "rollout_log_probs").to(log_prob.dtype), mask,
                level=cfg.rollout_is, cap=cfg.rollout_is_cap, lower=lower,
            )  # fmt: skip
            is_metrics = rollout_is_metrics(weights, mask, cfg.rollout_is_cap, lower)
        pg_loss_fn = get_policy_loss_fn(cfg.policy_loss, where="[algorithm] policy_loss")
        loss, pg_metrics = pg_loss_fn(
            old_log_prob, log_prob, advantages, mask,
            loss_agg_mode=mode, config=cfg, totals=totals, rollout_is_weights=weights,
        )  # fmt: skip
        metrics = {**pg_metrics, **is_metrics}
        if outputs.entropy is not None:
            entropy = agg_loss(outputs.entropy, mask, mode, totals)
            metrics["actor/entropy"] = local_metric(entropy, mode, totals, mask)
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
            metrics["actor/kl_loss"] = local_metric(kl_loss, mode, totals, mask)
            metrics["actor/kl_coef"] = cfg.kl_loss_coef
        return loss, metrics
