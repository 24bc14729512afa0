"""Registers the ``code`` reward and the ``code_interpreter`` tool. Imports nothing heavy."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"code": "rlcore_code.reward:CodeReward"}


@hookimpl
def register_tools() -> dict[str, str]:
    return {"code_interpreter": "rlcore_code.tool:CodeInterpreterTool"}
