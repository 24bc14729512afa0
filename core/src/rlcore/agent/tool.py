"""The tool contract (the fifth plugin kind): what an agent loop can call between model turns.

A tool plugin registers classes through the ``register_tools`` hook, like the other kinds::

    @hookimpl
    def register_tools():
        return {"calculator": "rlcore_calculator.tool:CalculatorTool"}

and ``[agent] tools = ["calculator"]`` selects them. This module imports neither torch nor
plugins, so discovery stays light.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import attrs

from rlcore.errors import RlcoreError

__all__ = ["BaseTool", "ToolError"]


class ToolError(RlcoreError):
    """A tool refused its arguments; the message goes into the conversation as the result."""


class BaseTool(abc.ABC):
    """A function the model may call by name with JSON arguments; returns text.

    ``schema()`` is the OpenAI/Hermes function description put in the system prompt and
    used by the agent loop to find the tool by ``schema()["name"]``. ``call`` is synchronous
    and is run by the loop in a thread with a time limit (``[agent] tool_timeout_s``); it
    must not ``eval``/``exec`` model output. Bad arguments raise :class:`ToolError` (its
    message is shown to the model); any other exception is also caught, shown and counted
    as an error. Example::

        tool.call({"expression": "12 * (3 + 4)"})   # -> "84"
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The tool's own options."""

    def __init__(self, config: BaseTool.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyTool()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def schema(self) -> dict[str, Any]:
        """``{"name": ..., "description": ..., "parameters": <JSON schema object>}``."""

    @abc.abstractmethod
    def call(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool on the parsed arguments; the text returned is shown to the model."""

    @property
    def name(self) -> str:
        return str(self.schema()["name"])
