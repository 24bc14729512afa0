"""Registers the ``math`` rule reward. Imports nothing heavy: the class is named by string."""

from __future__ import annotations

from collections.abc import Mapping

from rlcore.hookspecs import hookimpl


@hookimpl
def register_rewards() -> Mapping[str, str | type]:
    return {"math": "rlcore_math.reward:MathReward"}
