"""The ``calculator`` tool: ``{"expression": "12 * (3 + 4)"}`` -> ``"84"``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from rlcore.agent import BaseTool, ToolError
from rlcore.interfaces import key
from rlcore_calculator.evaluate import CalculatorError, evaluate, format_number

__all__ = ["CalculatorTool"]


class CalculatorTool(BaseTool):
    """Arithmetic without ``eval`` (see :mod:`rlcore_calculator.evaluate` for the limits)."""

    @attrs.frozen(kw_only=True)
    class Config(BaseTool.Config):
        """Options of the ``calculator`` tool."""

        name: str = key("calculator", "The name the model calls the tool by (its schema's name).")

    def __init__(self, config: CalculatorTool.Config | None = None) -> None:
        super().__init__(config)
        self.config: CalculatorTool.Config

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}
                },
                "required": ["expression"],
            },
        }

    def call(self, arguments: Mapping[str, Any]) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            msg = 'calculator needs {"expression": "<arithmetic>"}'
            raise ToolError(msg)
        try:
            return format_number(evaluate(expression))
        except CalculatorError as err:
            raise ToolError(str(err)) from err
