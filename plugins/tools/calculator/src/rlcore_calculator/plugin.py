"""Registers the ``calculator`` tool and the ``gsm8k_tool`` reward. Imports nothing heavy."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl


@hookimpl
def register_tools() -> dict[str, str]:
    return {"calculator": "rlcore_calculator.tool:CalculatorTool"}


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"gsm8k_tool": "rlcore_calculator.environment:GSM8KToolReward"}
