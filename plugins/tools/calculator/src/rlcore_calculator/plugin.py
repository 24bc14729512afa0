"""Registers the ``calculator`` tool, the ``gsm8k_tool`` reward and the ``openai_calculator``
harness (an OpenAI-client agent). Imports nothing heavy."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_tools() -> dict[str, str]:
    return {"calculator": "rlcore_calculator.tool:CalculatorTool"}


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"gsm8k_tool": "rlcore_calculator.environment:GSM8KToolReward"}


@hookimpl
def register_harnesses() -> dict[str, str]:
    return {"openai_calculator": "rlcore_calculator.harness:OpenAICalculatorHarness"}
