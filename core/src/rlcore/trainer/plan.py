"""``LoopPlan``: when the loop validates, saves and stops, decided once from the config.

The loop asks the plan, not the config: ``plan.validate_after(step)``, ``plan.save_after(step)``.
Built beside the per-role specs (:func:`build_loop_plan`), so the loop never reads
``[trainer]`` itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from rlcore.config import RunConfig

__all__ = ["LoopPlan", "build_loop_plan"]


@attrs.frozen(kw_only=True)
class LoopPlan:
    """The loop's cadence (``[trainer]``'s keys, resolved for this run).

    ``total_steps``: training steps of the run; ``test_freq`` (0: no validation after a step)
    and ``save_freq`` (0: only at the end);
    ``validate``: a validation set exists; ``grad_norm_ceiling`` and
    ``max_consecutive_nonfinite``: when the run stops as diverged.
    """

    total_steps: int
    test_freq: int = 0
    save_freq: int = 0
    val_before_train: bool = True
    validate: bool = False
    grad_norm_ceiling: float | None = None
    max_consecutive_nonfinite: int = 3

    def is_last(self, step: int) -> bool:
        return step >= self.total_steps

    def validate_before(self, *, resumed: bool) -> bool:
        """Validate before the first step; a resumed run did so at that step's weights already."""
        return self.validate and self.val_before_train and not resumed

    def validate_after(self, step: int) -> bool:
        """Every ``test_freq`` steps and after the last one (with ``test_freq`` set)."""
        return (
            self.validate
            and bool(self.test_freq)
            and (step % self.test_freq == 0 or self.is_last(step))
        )

    def save_after(self, step: int, *, interrupted: bool = False) -> bool:
        """Every ``save_freq`` steps, after the last one, and when a stop was asked for."""
        return (
            self.is_last(step) or interrupted or bool(self.save_freq and step % self.save_freq == 0)
        )


def build_loop_plan(config: RunConfig, total_steps: int, *, has_validation: bool) -> LoopPlan:
    """The plan of a run of ``total_steps`` steps, from ``[trainer]``."""
    cfg = config.trainer
    return LoopPlan(
        total_steps=total_steps,
        test_freq=cfg.test_freq,
        save_freq=cfg.save_freq,
        val_before_train=cfg.val_before_train,
        validate=has_validation,
        grad_norm_ceiling=cfg.grad_norm_ceiling,
        max_consecutive_nonfinite=cfg.max_consecutive_nonfinite,
    )
