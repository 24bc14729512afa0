"""Registers the ``math`` rule reward. Imports nothing heavy: the class is named by string."""

from __future__ import annotations

from collections.abc import Mapping

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_rewards() -> Mapping[str, str | type]:
    return {"math": "rlcore_math.reward:MathReward"}
