"""Registers the ``gsm8k`` reward. Imports nothing heavy: the class is named, not imported."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"gsm8k": "rlcore_gsm8k.reward:GSM8KReward"}
