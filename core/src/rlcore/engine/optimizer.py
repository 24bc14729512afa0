"""The optimizer step every engine shares: the LR schedule, grad-norm clipping, and the guard
that skips a non-finite step and counts steps and skips.

The worker computes the LR (:func:`learning_rate`) and passes it to ``optimizer_step``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rlcore.errors import EngineError
from rlcore.interfaces import (
    EngineSpec,
    OptimConfig,
)

if TYPE_CHECKING:
    import torch


log = logging.getLogger(__name__)

__all__ = [
    "GuardedSteps",
    "OptimizerGuard",
    "clip_and_step",
    "clip_grad_norm",
    "learning_rate",
    "lr_multiplier",
    "set_lr",
]


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Multiplier of the base LR for optimizer step ``step`` (0-based: steps already taken).

    With ``w = warmup_steps`` and ``T = total_steps``::

        step < w:        (step + 1) / w                      # linear warm-up, step 0 trains
        "constant":      1
        "cosine":        m + (1 - m) * (1 + cos(pi * p)) / 2,
                         p = min(1, (step - w) / max(1, T - 1 - w)),  m = min_lr_ratio

    so the cosine schedule starts at 1 right after warm-up and reaches ``min_lr_ratio`` at the
    last step, ``step = T - 1``, and stays there for any step beyond.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate(optim: OptimConfig, step: int, total_steps: int) -> float:
    """``optim.lr`` times :func:`lr_multiplier` at ``step`` of ``total_steps``."""
    return optim.lr * lr_multiplier(
        step,
        warmup_steps=optim.warmup_steps,
        total_steps=total_steps,
        schedule=optim.schedule,
        min_lr_ratio=optim.min_lr_ratio,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set ``lr`` on every parameter group (what ``optimizer_step(lr=...)`` does first)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> float:
    """The global grad norm of ``parameters`` (before clipping); clips to ``max_norm`` (<= 0:
    no clipping). Works for FSDP2's DTensor norms (reduced to a plain number here)."""
    import torch

    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm if max_norm > 0 else math.inf)
    full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP2
    return float(full() if callable(full) else norm)


class OptimizerGuard:
    """The body of :meth:`~rlcore.interfaces.BaseEngine.optimizer_step`, with its counters.

    :meth:`step` takes the grad norm (and clips to ``spec.grad_clip``), steps the optimizer
    at the ``lr`` the worker passed unless the norm is non-finite (a NaN/inf loss or
    gradient: the step is skipped, counted and logged, and the optimizer state is
    untouched), and zeroes the gradients either way. ``global_step`` counts steps taken,
    ``skipped_steps`` steps skipped, ``lr`` is the rate of the last step taken (0 before
    any); :meth:`state_dict` holds the counters for the engine's checkpoint. A run that
    diverges with a finite norm is the trainer's to stop (``trainer.grad_norm_ceiling``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, role: str, max_norm: float) -> None:
        self.optimizer = optimizer
        self.role = role
        self.max_norm = max_norm
        self.global_step = 0
        self.skipped_steps = 0
        self.lr = 0.0

    def step(
        self,
        *,
        lr: float,
        parameters: Iterable[torch.Tensor] | None = None,
        clip: Callable[[float], float] | None = None,
    ) -> float:
        """Clip, step at ``lr`` unless non-finite, zero grads; returns the grad norm.

        The norm is :func:`clip_grad_norm` of ``parameters`` (default: every parameter the
        optimizer holds), or ``clip(max_norm)`` for an engine whose gradients are sharded in
        a way torch's clipping does not know (it clips in place and returns the global norm
        before clipping; ``max_norm`` is ``inf`` when clipping is off).
        """
        if clip is not None:
            grad_norm = clip(self.max_norm if self.max_norm > 0 else math.inf)
        else:
            if parameters is None:
                parameters = [p for g in self.optimizer.param_groups for p in g["params"]]
            grad_norm = clip_grad_norm(parameters, self.max_norm)
        if math.isfinite(grad_norm):
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self.lr = lr
            self.global_step += 1
        else:
            self.skipped_steps += 1
            log.warning(
                "[%s] grad norm is %s at step %d: update skipped",
                self.role,
                grad_norm,
                self.global_step,
            )
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def state_dict(self) -> dict[str, int]:
        return {"global_step": self.global_step, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.skipped_steps = int(state["skipped_steps"])


class GuardedSteps:
    """The optimizer side every engine that steps through an :class:`OptimizerGuard` shares.

    A mixin before :class:`~rlcore.interfaces.BaseEngine` in an engine's bases; the engine
    sets ``self._guard`` when it builds its optimizer and leaves it None without one (the
    reference, or no ``optim``). ``global_step``, ``skipped_steps`` and ``lr`` are the
    guard's counters (0 without one); :meth:`_require_guard` is the check a training call
    starts with.
    """

    spec: EngineSpec
    _guard: OptimizerGuard | None = None

    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        return self._guard.global_step if self._guard is not None else 0

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite grad norm."""
        return self._guard.skipped_steps if self._guard is not None else 0

    @property
    def lr(self) -> float:
        """The learning rate of the last optimizer step (0 before any)."""
        return self._guard.lr if self._guard is not None else 0.0

    def _require_guard(self, error: type[EngineError]) -> OptimizerGuard:
        """The guard, or ``error`` (the engine's own class) for an engine that cannot train."""
        if self._guard is None:
            msg = f"[{self.spec.role}] engine has no optimizer (role 'ref' or optim unset)"
            raise error(msg)
        return self._guard


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[torch.Tensor],
    *,
    lr: float,
    max_norm: float,
) -> float:
    """Clip to ``max_norm`` (<= 0: no clipping), step at ``lr``, zero grads; the grad norm.

    A non-finite norm (a NaN/inf loss or gradient) skips the step: the gradients are zeroed
    and the optimizer state is untouched, and the norm is returned as is for the caller to
    report. :class:`OptimizerGuard` is the same step with counters and a log line.
    """
    grad_norm = clip_grad_norm(parameters, max_norm)
    if math.isfinite(grad_norm):
        set_lr(optimizer, lr)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
