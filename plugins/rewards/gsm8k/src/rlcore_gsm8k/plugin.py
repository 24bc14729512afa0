"""Registers the ``gsm8k`` reward. Imports nothing heavy: the class is named, not imported."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"gsm8k": "rlcore_gsm8k.reward:GSM8KReward"}
