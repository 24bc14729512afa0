"""The learning-rate multiplier: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Multiplier of the base LR for optimizer step ``step`` (0-based).

    Warm-up is linear and reaches 1 on step ``warmup_steps - 1`` (so step 0 already trains,
    with ``1 / warmup_steps`` of the LR). ``cosine`` then decays from 1 to ``min_lr_ratio`` at
    step ``total_steps - 1`` and stays there.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
