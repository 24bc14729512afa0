"""The tool contract (the fifth plugin kind).

What an agent loop can call between model turns. A tool plugin registers classes through the
``register_tools`` hook like the other kinds, and ``[agent] tools = ["calculator"]`` selects them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import attrs

from rlcore.errors import RlcoreError


class ToolError(RlcoreError):
    """A tool refused its arguments; the message goes into the conversation as the result."""


class BaseTool(abc.ABC):
    """A function the model may call by name with JSON arguments; returns text.

    ``schema()`` is the OpenAI/Hermes function description: with ``[agent] tool_turns =
    "chat_template"`` it is rendered into every prompt by the tokenizer's chat template
    (``apply_chat_template(tools=...)``, :mod:`rlcore.agent.template`); with ``"hermes"`` the
    data's own system prompt describes the tool. The agent loop finds the tool by
    ``schema()["name"]``; its ``Config`` is set in ``[agent.options.NAME]``. ``call`` is synchronous
    and is run by the loop in a process of its own per call, killed at ``[agent]
    tool_timeout_s`` (:mod:`rlcore.agent.tool_processes`), so the tool must pickle; it must
    not ``eval``/``exec`` model output in-process (``rlcore-code``'s ``code_interpreter`` runs
    it in a sandboxed subprocess). Bad arguments raise :class:`ToolError` (its message is
    shown to the model); anything else raised (``SystemExit`` included) is also caught, shown
    and counted as an error. Example::

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
