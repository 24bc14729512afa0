"""Train/rollout mismatch: how far the rollout's log-probs are from the training engine's.

A rollout engine (vLLM, SGLang, even HF ``generate`` with its KV cache) computes the sampled
tokens' log-probs with other kernels than the training engine, and a missed or partial weight
sync makes it sample from another policy altogether. Every step where the rollout returned
``rollout_log_probs`` the run logs, over valid response tokens,

- ``rollout/logprob_diff_mean``: mean of ``|log pi_old - log pi_rollout|``;
- ``rollout/logprob_diff_max``: its maximum.

In float32 with the weights in sync both are ~1e-6 (kernel rounding); a stale or wrong sync
shows up as 1e-2 and above. ``log pi_old`` is the engine's ``old_log_probs``: from the
driver's old-log-prob pass when it runs, else (on-policy updates, :mod:`rlcore.roles.levers`)
from the update's own forward under the same weights, tallied on the worker
(:class:`MismatchTally`). In the second case rows the update leaves out (zero-advantage rows,
``actor.skip_zero_advantage_rows``) are not counted. Several ranks' means are averaged and
their maxima maxed by the driver (keys ending in ``_max``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import torch

__all__ = ["DIFF_MAX", "DIFF_MEAN", "MismatchTally", "logprob_diff_metrics"]

DIFF_MEAN = "rollout/logprob_diff_mean"
DIFF_MAX = "rollout/logprob_diff_max"


@attrs.define
class MismatchTally:
    """Sum, count and max of ``|old - rollout|`` over the micro-batches of one update."""

    total: float = 0.0
    tokens: int = 0
    largest: float = 0.0

    def add(
        self,
        old_log_probs: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> None:
        import torch

        with torch.no_grad():
            valid = response_mask != 0
            diff = old_log_probs.detach().float() - rollout_log_probs.float().to(valid.device)
            diff = diff.abs()[valid]
            if diff.numel() == 0:
                return
            self.total += float(diff.sum().item())
            self.tokens += int(diff.numel())
            self.largest = max(self.largest, float(diff.max().item()))

    def metrics(self) -> dict[str, float]:
        """The two metrics, or nothing when no valid token was seen."""
        if not self.tokens:
            return {}
        return {DIFF_MEAN: self.total / self.tokens, DIFF_MAX: self.largest}


def logprob_diff_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """``rollout/logprob_diff_mean`` and ``_max`` of one batch (nothing when it has no tokens)."""
    tally = MismatchTally()
    tally.add(old_log_probs, rollout_log_probs, response_mask)
    return tally.metrics()
