"""Registers the ``code`` reward and the ``code_interpreter`` tool. Imports nothing heavy."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this package is written for (core/README.md, Contract versions).
contract_version = 2


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"code": "rlcore_code.reward:CodeReward"}


@hookimpl
def register_tools() -> dict[str, str]:
    return {"code_interpreter": "rlcore_code.tool:CodeInterpreterTool"}
