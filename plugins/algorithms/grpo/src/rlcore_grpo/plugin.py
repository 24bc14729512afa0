"""Registers ``grpo``, ``reinforce_plus_plus`` and ``best_of_n`` (rejection-sampling fine-tuning
on each group's best responses). Imports nothing heavy: classes are named."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_algorithms() -> dict[str, str]:
    return {
        "grpo": "rlcore_grpo.algorithm:GRPO",
        "reinforce_plus_plus": "rlcore_grpo.algorithm:ReinforcePlusPlus",
        "best_of_n": "rlcore_grpo.best_of_n:BestOfN",
    }
