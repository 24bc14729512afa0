"""The reward manager: decode responses, score them with per-sample rule rewards (in a process
pool) and batched scorers (in the driver, :mod:`rlcore.reward.batched`), combine them by weight
and place the score on the last valid response token. See :class:`RewardManager`."""

from __future__ import annotations

from rlcore.reward.manager import RewardManager
from rlcore.reward.pool import ScoringPool

__all__ = ["RewardManager", "ScoringPool"]
