"""GSM8K rule reward for rlcore: ``#### <number>`` extraction with verl's semantics."""

from __future__ import annotations

from rlcore_gsm8k.reward import GSM8KReward, compute_score, extract_solution

__all__ = ["GSM8KReward", "compute_score", "extract_solution"]
