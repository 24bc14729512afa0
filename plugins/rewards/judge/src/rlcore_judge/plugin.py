"""Registers the ``judge`` reward. Imports nothing heavy: the class is named."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"judge": "rlcore_judge.reward:JudgeReward"}
