"""Tool-call parsers: find the calls in a model turn and format the tools' answers.

The model's tokens are never re-encoded: a parser reads the *decoded* text of a turn only to
find calls, and returns the text of the tool turn that the loop encodes and appends (masked
out of the loss). Selected by ``[agent] tool_parser``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

import attrs

__all__ = ["PARSERS", "HermesToolParser", "ToolCall", "ToolCallParser", "get_parser"]


@attrs.frozen(kw_only=True)
class ToolCall:
    """One parsed call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


class ToolCallParser:
    """The interface: ``parse(text) -> (calls, errors)`` and ``format_responses``."""

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        raise NotImplementedError

    def format_responses(self, results: Sequence[str]) -> str:
        raise NotImplementedError


class HermesToolParser(ToolCallParser):
    """Qwen2.5 / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    The tool turn follows Qwen2.5's chat template for ``role = "tool"`` messages (a user turn
    of ``<tool_response>`` blocks) and ends with the assistant generation prompt, so the next
    model turn starts where a chat-templated conversation would.
    """

    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
    # A call whose closing tag never came (the model stopped mid-call).
    _OPEN = re.compile(r"<tool_call>(?![\s\S]*</tool_call>)")

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for body in self._CALL.findall(text):
            try:
                data = json.loads(body)
            except json.JSONDecodeError as err:
                errors.append(f"tool call is not valid JSON: {err.msg} at char {err.pos}")
                continue
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                errors.append('tool call must be a JSON object with a string "name"')
                continue
            args = data.get("arguments", {})
            if isinstance(args, str):  # some models emit the arguments JSON-encoded
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    errors.append(f"arguments of {data['name']!r} are not a JSON object")
                    continue
            if not isinstance(args, dict):
                errors.append(f"arguments of {data['name']!r} must be a JSON object")
                continue
            calls.append(ToolCall(name=data["name"], arguments=args))
        if self._OPEN.search(text):
            errors.append("tool call without a closing </tool_call>")
        return calls, errors

    def format_responses(self, results: Sequence[str]) -> str:
        blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
        return f"\n<|im_start|>user\n{blocks}<|im_end|>\n<|im_start|>assistant\n"


PARSERS: Final[dict[str, type[ToolCallParser]]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
}


def get_parser(name: str) -> ToolCallParser:
    return PARSERS[name]()
