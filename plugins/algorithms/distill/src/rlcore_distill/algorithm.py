"""On-policy distillation: the student samples, a frozen teacher scores the student's tokens.

The objective is the per-token reverse KL ``KL(student || teacher)`` on the student's own
samples (GKD with the reverse divergence, arXiv 2306.13649; Thinking Machines' "on-policy
distillation", 2025, and its Tinker cookbook; the Qwen3 report's distillation stage). It is
trained the low-variance way Tinker does: a policy gradient whose per-token advantage is the
negative sampled reverse KL, detached,

    A_t = -teacher_kl_coef * (log pi_student(y_t) - log pi_teacher(y_t))
          + reward_weight * A_grpo

with ``log pi_student`` the old log-probs of the sampling policy (the old-log-prob pass) and
``log pi_teacher`` the teacher role's (``teacher_log_prob``), fed to the core's clipped policy
loss with token-mean aggregation: no critic, no group normalisation of the KL part. On-policy
(one epoch, one mini-batch) the ratio is 1 and the gradient is exactly
``-E[A_t * grad log pi(y_t)]``, the score-function gradient of the reverse KL. ``A_grpo`` is
GRPO's group-normalised outcome advantage (``adv_estimator``, default ``grpo``), mixed in with
``reward_weight`` (0 by default: pure distillation; the reward is still computed and logged,
so accuracy stays visible).

Config (``[algorithm]``, beside every ``PolicyGradientAlgorithm`` option):
``teacher_kl_coef`` (1.0, the weight of the reverse-KL advantage; not ``kl_ctrl.kl_coef``,
the KL to the reference in the reward), ``reward_weight`` (0.0), and GRPO's ``norm_adv_by_std`` /
``epsilon`` for the reward part. The teacher is configured by ``[roles.teacher] model =
{ path = ... }``; it must share the student's tokenizer (its log-probs are of the student's
token ids).

Metrics per step: ``distill/reverse_kl`` (mean per response token of
``log pi_student - log pi_teacher``), ``distill/teacher_log_prob_mean``,
``distill/student_log_prob_mean``, ``distill/kl_advantage_mean`` and ``_abs_mean`` (the KL
part of the advantage) and, with ``reward_weight > 0``, ``distill/reward_advantage_mean`` and
``_abs_mean`` (the weighted reward part).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from rlcore.interfaces import ExtraRole, key
from rlcore.rl.advantages import GRPOOptions
from rlcore.rl.algorithm import PolicyGradientAlgorithm, adv_estimator_key, require
from rlcore.rl.step import Phase, StepContext, StepProgram

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from rlcore.protocol import DataProto

__all__ = ["TEACHER", "Distill", "DistillProgram", "distill_advantages", "distill_metrics"]

_v = attrs.validators

#: The frozen teacher: ``[roles.teacher]``, its log-probs in ``batch["teacher_log_prob"]``.
TEACHER = ExtraRole(name="teacher")


def distill_advantages(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    teacher_kl_coef: float = 1.0,
    reward_advantages: torch.Tensor | None = None,
    reward_weight: float = 0.0,
) -> torch.Tensor:
    """Per-token ``-teacher_kl_coef * (logp_s - logp_t) + reward_weight * A_reward``, 0 under
    the mask.

    All (B, R); detached (an advantage carries no gradient). Positions outside
    ``response_mask`` are exactly 0 whatever the log-probs hold there (padding may be -inf).
    """
    import torch

    student = student_log_probs.detach()
    mask = response_mask.to(torch.bool)
    reverse_kl = student - teacher_log_probs.detach().to(student.dtype)
    adv = -teacher_kl_coef * reverse_kl
    if reward_weight and reward_advantages is not None:
        adv = adv + reward_weight * reward_advantages.detach().to(student.dtype)
    return torch.where(mask, adv, torch.zeros_like(adv))


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    import torch

    values = torch.where(mask, values, torch.zeros_like(values))
    return float(values.sum() / mask.sum().clamp(min=1))


def distill_metrics(
    batch: DataProto, *, teacher_kl_coef: float, reward_weight: float
) -> dict[str, float]:
    """``distill/*`` of a batch after :meth:`Distill.compute_advantages` (means per token)."""
    import torch

    mask = require(batch, "response_mask").to(torch.bool)
    student = require(batch, "old_log_probs")
    teacher = require(batch, TEACHER.output_key).to(student.dtype)
    kl_part = -teacher_kl_coef * (student - teacher)
    metrics = {
        "distill/reverse_kl": _masked_mean(student - teacher, mask),
        "distill/teacher_log_prob_mean": _masked_mean(teacher, mask),
        "distill/student_log_prob_mean": _masked_mean(student, mask),
        "distill/kl_advantage_mean": _masked_mean(kl_part, mask),
        "distill/kl_advantage_abs_mean": _masked_mean(kl_part.abs(), mask),
    }
    if reward_weight:
        reward_part = require(batch, "advantages").to(student.dtype) - kl_part
        metrics["distill/reward_advantage_mean"] = _masked_mean(reward_part, mask)
        metrics["distill/reward_advantage_abs_mean"] = _masked_mean(reward_part.abs(), mask)
    return metrics


class DistillProgram(StepProgram):
    """The default step with the teacher's log-probs before the advantages.

    generate -> (after_generate phases) -> old log-probs -> reference (when a KL loss asks for
    it) -> ``teacher`` (an ``after_log_probs`` phase) -> reward -> advantages -> the
    ``distill/*`` metrics -> (before_update phases) -> update. It carries nothing from step to
    step (no ``state_dict``).
    """

    def __init__(
        self,
        config: Distill.Config,
        *,
        after_generate: Sequence[Phase] = (),
        before_update: Sequence[Phase] = (),
    ) -> None:
        super().__init__(
            after_generate=after_generate,
            after_log_probs=(self._teacher,),
            before_update=(self._log_distill, *before_update),
        )
        self.config = config

    @staticmethod
    def _teacher(ctx: StepContext, batch: DataProto) -> DataProto:
        # The student's log-probs are read on the driver (the advantage): Distill.needs keeps
        # the old-log-prob pass (old_log_probs_on_driver), so they are in the batch here.
        teacher = ctx.roles[TEACHER.name]
        return batch | ctx.phase("teacher", teacher.compute_log_prob, ctx.model_in)

    def _log_distill(self, ctx: StepContext, batch: DataProto) -> DataProto:
        cfg = self.config
        ctx.metrics |= distill_metrics(
            batch, teacher_kl_coef=cfg.teacher_kl_coef, reward_weight=cfg.reward_weight
        )
        return batch


class Distill(PolicyGradientAlgorithm):
    """On-policy distillation from the ``teacher`` role (see the module docstring)."""

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config, GRPOOptions):
        teacher_kl_coef: float = key(
            1.0,
            "Weight of the per-token reverse-KL advantage -(log p_student - "
            "log p_teacher); not kl_ctrl.kl_coef (the reference KL in the reward).",
            validator=_v.ge(0.0),
        )
        reward_weight: float = key(
            0.0,
            "Weight of the reward's advantage (adv_estimator, GRPO's by default) "
            "added to the KL part; 0: pure distillation (the reward is still logged).",
            validator=_v.ge(0.0),
        )
        adv_estimator: str | None = adv_estimator_key(
            "grpo",
            "The estimator of the reward part (with reward_weight > 0).",
        )

        def __attrs_post_init__(self) -> None:
            if self.teacher_kl_coef == 0.0 and self.reward_weight == 0.0:
                msg = (
                    "teacher_kl_coef and reward_weight are both 0: the advantage is 0, "
                    "nothing trains"
                )
                raise ValueError(msg)
            if self.reward_weight and self.adv_estimator is None:
                msg = "reward_weight > 0 needs an adv_estimator for the reward part (e.g. 'grpo')"
                raise ValueError(msg)

    config: Distill.Config

    @property
    def extra_roles(self) -> tuple[ExtraRole, ...]:
        return (TEACHER,)

    @property
    def needs_old_log_probs_on_driver(self) -> bool:
        """Always: the advantage reads the student's ``old_log_probs`` on the driver."""
        return True

    def compute_advantages(self, batch: DataProto) -> DataProto:
        """``advantages`` = ``returns`` = :func:`distill_advantages` of the batch; reads
        ``old_log_probs``, ``teacher_log_prob``, ``response_mask`` (and, with
        ``reward_weight``, what the ``adv_estimator`` reads: ``token_level_rewards``, ``uid``)."""
        cfg = self.config
        student = require(batch, "old_log_probs")
        teacher = require(batch, TEACHER.output_key)
        mask = require(batch, "response_mask")
        reward_adv = None
        if cfg.reward_weight:
            batch = super().compute_advantages(batch)
            reward_adv = batch.batch["advantages"]
        adv = distill_advantages(
            student,
            teacher,
            mask,
            teacher_kl_coef=cfg.teacher_kl_coef,
            reward_advantages=reward_adv,
            reward_weight=cfg.reward_weight,
        )
        batch.batch["advantages"] = adv
        batch.batch["returns"] = adv.clone()
        return batch

    def step_program(self) -> DistillProgram:
        return DistillProgram(self.config)
