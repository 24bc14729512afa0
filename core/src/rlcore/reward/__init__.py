"""The reward manager: decode responses, score them with rule rewards, place the score on the
last valid response token. See :class:`RewardManager`."""

from __future__ import annotations

from rlcore.reward.manager import RewardManager
from rlcore.reward.pool import ScoringPool

__all__ = ["RewardManager", "ScoringPool"]
