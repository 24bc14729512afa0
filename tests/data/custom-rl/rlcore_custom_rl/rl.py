"""The functions behind ``custom_pg`` and ``group_size``, written against rlcore's registry
signatures only (no rlcore file edited). Each leaves a trace a test can read in the metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlcore.rl.losses import PolicyLossTerms, policy_loss_fn

# The metric custom_pg emits: the clip_ratio_high it read from [algorithm], so a test sees
# both that this loss ran and that it got the algorithm's Config.
MARKER = "actor/custom_pg_clip_ratio_high"


@policy_loss_fn
def compute_policy_loss_custom_pg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> PolicyLossTerms:
    """Unclipped ``-A * ratio`` per token (aggregated by rlcore's shared tail)."""
    log_ratio = log_prob - old_log_prob  # (b, R)
    return PolicyLossTerms(
        token_losses=-advantages * torch.exp(log_ratio),
        kl=-log_ratio,
        metrics={MARKER: float(config.clip_ratio_high)},
    )


@torch.no_grad()
def compute_group_size_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    config: Any,
    index: np.ndarray | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's advantage is (rows sharing its uid) / 4 on every valid token, whatever the
    rewards: ``rollout.n = 2`` gives 0.5 everywhere, which no built-in estimator would."""
    if index is None:
        raise KeyError("group_size needs non_tensor_batch['uid']")
    uids = list(index)
    sizes = torch.tensor([uids.count(u) for u in uids], dtype=token_level_rewards.dtype)
    adv = torch.where(
        response_mask != 0, (sizes / 4.0).unsqueeze(-1).expand_as(token_level_rewards), 0.0
    )
    return adv, adv
