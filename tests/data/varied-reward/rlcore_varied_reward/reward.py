"""``parity``: 1 when the response's characters sum to an even code point total, else 0.

A test double for runs of an untrained tiny model, which never answers an arithmetic prompt
right: the GSM8K rule gives every sample 0 there, so group-relative advantages are all zero
and an algorithm that filters or compares samples (DAPO's dynamic sampling, ReMax's
baseline) has nothing to act on. This reward is deterministic and splits random text about
in half, so groups differ and those code paths run.
"""

from __future__ import annotations

from typing import Any

from rlcore.interfaces import BaseReward


class ParityReward(BaseReward):
    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        even = sum(map(ord, solution_str)) % 2 == 0
        return {"score": float(even), "acc": even}
