"""GRPO (and Dr. GRPO) and REINFORCE++: critic-free outcome-reward advantages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs
import numpy as np

from rlcore.rl.advantages import (
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
)
from rlcore.rl.algorithm import PolicyGradientAlgorithm, require

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = ["GRPO", "ReinforcePlusPlus"]

_v = attrs.validators


def _uids(batch: DataProto) -> np.ndarray:
    if "uid" not in batch.non_tensor_batch:
        msg = "group advantages need non_tensor_batch['uid'] (the prompt id of each sample)"
        raise KeyError(msg)
    return batch.non_tensor_batch["uid"]


class GRPO(PolicyGradientAlgorithm):
    """Group relative policy optimisation (DeepSeekMath): responses to one prompt are a group.

    Advantage of response i in group g: ``(score_i - mean_g) / (std_g + epsilon)``, or
    ``score_i - mean_g`` with ``norm_adv_by_std = false`` (Dr. GRPO, arXiv 2503.20783, which
    also uses ``loss_agg_mode = "seq-mean-token-sum-norm"``). Groups are read from
    ``non_tensor_batch["uid"]`` in any order; a group of one gets advantage 0.
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        norm_adv_by_std: bool = True
        epsilon: float = attrs.field(default=1e-6, validator=_v.gt(0.0))

    config: GRPO.Config

    def compute_advantages(self, batch: DataProto) -> DataProto:
        advantages, returns = compute_grpo_outcome_advantage(
            require(batch, "token_level_rewards"),
            require(batch, "response_mask"),
            _uids(batch),
            epsilon=self.config.epsilon,
            norm_adv_by_std=self.config.norm_adv_by_std,
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch


class ReinforcePlusPlus(PolicyGradientAlgorithm):
    """REINFORCE++ (arXiv 2501.03262): batch-whitened returns, no critic.

    ``baseline = "none"``: discounted token returns (``gamma``) whitened over the batch.
    ``baseline = "group"``: outcome score minus its group's mean (uid), then whitened.
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        baseline: Literal["none", "group"] = attrs.field(
            default="none", validator=_v.in_(("none", "group"))
        )
        gamma: float = attrs.field(default=1.0, validator=[_v.ge(0.0), _v.le(1.0)])

    config: ReinforcePlusPlus.Config

    def compute_advantages(self, batch: DataProto) -> DataProto:
        rewards = require(batch, "token_level_rewards")
        mask = require(batch, "response_mask")
        if self.config.baseline == "group":
            advantages, returns = compute_reinforce_plus_plus_baseline_outcome_advantage(
                rewards, mask, _uids(batch)
            )
        else:
            advantages, returns = compute_reinforce_plus_plus_outcome_advantage(
                rewards, mask, gamma=self.config.gamma
            )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch
