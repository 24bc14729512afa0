"""Tool-call parsers: find the calls in a model turn and format the tools' answers.

The model's tokens are never re-encoded: a parser reads the *decoded* text of a turn only to
find calls, and returns the text of the tool turn that the loop encodes and appends (masked
out of the loss). Selected by ``[agent] tool_parser``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import attrs

__all__ = [
    "MAX_CALL_CHARS",
    "MAX_CALL_DEPTH",
    "MAX_NUMBER_DIGITS",
    "PARSERS",
    "HermesToolParser",
    "ToolCall",
    "ToolCallParser",
    "get_parser",
    "json_bounds_problem",
]


@attrs.frozen(kw_only=True)
class ToolCall:
    """One parsed call: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


class ToolCallParser:
    """The interface: ``parse(text) -> (calls, errors)`` and ``format_responses``.

    ``parse`` reads model output, which is data: it returns an error string for each call it
    cannot read and never raises.
    """

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        raise NotImplementedError

    def format_responses(self, results: Sequence[str]) -> str:
        raise NotImplementedError


# Bounds checked before a call's JSON is parsed: the text is the policy's output, and a policy
# under RL drifts toward odd outputs. Past them json.loads raises RecursionError (nesting) or
# ValueError (Python's int-string limit) instead of JSONDecodeError, or takes long.
MAX_CALL_CHARS: Final = 64 * 1024
MAX_CALL_DEPTH: Final = 32
MAX_NUMBER_DIGITS: Final = 100

_OPEN_TAG: Final = "<tool_call>"
_CLOSE_TAG: Final = "</tool_call>"
_DIGITS: Final = frozenset("0123456789")


def json_bounds_problem(text: str) -> str | None:
    """Why ``text`` is outside the bounds above (one clause), or None when json.loads may read
    it. One pass, strings skipped (their brackets and digits are data), no regex."""
    if len(text) > MAX_CALL_CHARS:
        return f"is longer than {MAX_CALL_CHARS} characters"
    depth = digits = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in _DIGITS:
            digits += 1
            if digits > MAX_NUMBER_DIGITS:
                return f"holds a number of more than {MAX_NUMBER_DIGITS} digits"
            continue
        digits = 0
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_CALL_DEPTH:
                return f"nests deeper than {MAX_CALL_DEPTH} levels"
        elif ch in "]}":
            depth -= 1
    return None


def _loads(text: str) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, why)`` for anything json cannot read within bounds."""
    problem = json_bounds_problem(text)
    if problem is not None:
        return None, problem
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, f"is not valid JSON: {err.msg} at char {err.pos}"
    except (ValueError, RecursionError) as err:  # past the checks above: still data, not a crash
        return None, f"is not valid JSON ({type(err).__name__})"


class HermesToolParser(ToolCallParser):
    """Qwen2.5 / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    The tool turn follows Qwen2.5's chat template for ``role = "tool"`` messages (a user turn
    of ``<tool_response>`` blocks) and ends with the assistant generation prompt, so the next
    model turn starts where a chat-templated conversation would.

    ``parse`` never raises: a malformed call (bad JSON, past :data:`MAX_CALL_CHARS`,
    :data:`MAX_CALL_DEPTH` or :data:`MAX_NUMBER_DIGITS`, no closing tag) is an error string,
    which the loop shows to the model and counts.
    """

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        while True:
            start = text.find(_OPEN_TAG, pos)
            if start < 0:
                break
            end = text.find(_CLOSE_TAG, start + len(_OPEN_TAG))
            if end < 0:  # the model stopped mid-call
                errors.append(f"tool call without a closing {_CLOSE_TAG}")
                break
            body = text[start + len(_OPEN_TAG) : end].strip()
            pos = end + len(_CLOSE_TAG)
            call, error = self._one(body)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error or "tool call could not be read")
        return calls, errors

    @staticmethod
    def _one(body: str) -> tuple[ToolCall | None, str | None]:
        data, problem = _loads(body)
        if problem is not None:
            return None, f"tool call {problem}"
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None, 'tool call must be a JSON object with a string "name"'
        name = data["name"]
        args = data.get("arguments", {})
        if isinstance(args, str):  # some models emit the arguments JSON-encoded
            args, problem = _loads(args)
            if problem is not None:
                return None, f"arguments of {name!r:.100} are not a JSON object ({problem})"
        if not isinstance(args, dict):
            return None, f"arguments of {name!r:.100} must be a JSON object"
        return ToolCall(name=name, arguments=args), None

    def format_responses(self, results: Sequence[str]) -> str:
        blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
        return f"\n<|im_start|>user\n{blocks}<|im_end|>\n<|im_start|>assistant\n"


PARSERS: Final[dict[str, type[ToolCallParser]]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
}


def get_parser(name: str) -> ToolCallParser:
    return PARSERS[name]()
