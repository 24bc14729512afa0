"""RLOO: REINFORCE with a leave-one-out baseline over the samples of each prompt."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from rlcore.rl.advantages import compute_rloo_outcome_advantage
from rlcore.rl.algorithm import PolicyGradientAlgorithm, require

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = ["RLOO"]


class RLOO(PolicyGradientAlgorithm):
    """REINFORCE leave-one-out (arXiv 2402.14740).

    Advantage of response i: ``score_i - mean of the other scores of its prompt`` (groups by
    ``non_tensor_batch["uid"]``, in any order); a group of one gets 0. The loss is the shared
    clipped policy loss (set ``clip_ratio_low``/``high`` large for plain REINFORCE).
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        pass

    config: RLOO.Config

    def compute_advantages(self, batch: DataProto) -> DataProto:
        if "uid" not in batch.non_tensor_batch:
            msg = "RLOO needs non_tensor_batch['uid'] (the prompt id of each sample)"
            raise KeyError(msg)
        advantages, returns = compute_rloo_outcome_advantage(
            require(batch, "token_level_rewards"),
            require(batch, "response_mask"),
            batch.non_tensor_batch["uid"],
        )
        batch.batch["advantages"] = advantages
        batch.batch["returns"] = returns
        return batch
