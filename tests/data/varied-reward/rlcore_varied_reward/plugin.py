"""Registers the ``parity`` reward (a test double): imports nothing heavy."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

contract_version = 2


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"parity": "rlcore_varied_reward.reward:ParityReward"}
