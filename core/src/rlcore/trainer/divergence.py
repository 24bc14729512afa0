"""The divergence guard: stop a run whose update blew up, before it is saved.

Two checks, both on the driver:

- every step, a gradient norm above ``trainer.grad_norm_ceiling`` (unset: no ceiling) stops
  the run (:func:`check_grad_norm`; the ``rlcore`` command maps ``RLCORE_MAX_GRAD_NORM`` onto
  the key, e.g. for one rerun without editing the file). Non-finite
  gradients are already skipped by the engines and counted by the trainer
  (``trainer.max_consecutive_nonfinite``);
- before every checkpoint, the actor scores the step's batch once more with the weights about
  to be saved (:func:`check_policy_finite`): non-finite log-probabilities mean the weights
  diverged (e.g. ``actor.optim.lr = 1e30`` gives finite but enormous weights whose next
  generation fails on inf/nan probabilities), and the run stops without saving them. That
  costs one forward pass per checkpoint.

Either way the run ends with one :class:`DivergenceError` line naming the step and what to
change; the last saved checkpoint is still the newest one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rlcore.errors import RlcoreError

__all__ = [
    "GRAD_NORM_KEY",
    "DivergenceError",
    "check_grad_norm",
    "check_policy_finite",
]

GRAD_NORM_KEY = "trainer.grad_norm_ceiling"
_ROLES = ("actor", "critic")
_ADVICE = (
    "stopping without saving it; lower actor.optim.lr (or critic.optim.lr) or set "
    "actor.grad_clip, then resume from the last checkpoint"
)


class DivergenceError(RlcoreError):
    """An update made the model diverge; nothing of that step was saved."""


def check_grad_norm(metrics: Mapping[str, float], step: int, ceiling: float | None) -> None:
    """Raise :class:`DivergenceError` if a role's ``grad_norm`` exceeds ``ceiling``
    (``trainer.grad_norm_ceiling``; None: no ceiling)."""
    if ceiling is None:
        return
    for role in _ROLES:
        norm = metrics.get(f"{role}/grad_norm")
        if norm is not None and math.isfinite(norm) and norm > ceiling:
            msg = (
                f"step {step}: {role}/grad_norm = {norm:.4g} exceeds {GRAD_NORM_KEY} = "
                f"{ceiling:g}; {_ADVICE}"
            )
            raise DivergenceError(msg)


def check_policy_finite(policy: Any, model_in: Any, step: int) -> None:
    """Score ``model_in`` with the actor's current weights; non-finite -> :class:`DivergenceError`.

    ``policy`` is the actor worker group, ``model_in`` the step's batch as the actor's
    ``compute_log_prob`` takes it (responses and their mask).
    """
    if model_in is None:
        return
    import torch

    out = policy.compute_log_prob(model_in)
    log_probs = out.batch["old_log_probs"]
    mask = model_in.batch["response_mask"].to(torch.bool)
    scored = log_probs[mask]
    if bool(torch.isfinite(scored).all()):
        return
    bad = int((~torch.isfinite(scored)).sum())
    msg = (
        f"step {step}: after the update the actor's log-probabilities are not finite ({bad} of "
        f"{scored.numel()} response tokens): its weights diverged; {_ADVICE}"
    )
    raise DivergenceError(msg)
