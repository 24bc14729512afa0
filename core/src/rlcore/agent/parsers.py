"""Tool-call parsers: find the calls in a model turn and format the tools' answers.

The model's tokens are never re-encoded: a parser reads the *decoded* text of a turn only to
find calls, and returns the text of the tool turn that the loop encodes and appends (masked
out of the loss). Selected by ``[agent] tool_parser``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from rlcore.config.schema import BUILTIN_TOOL_TURNS

__all__ = [
    "BUILTIN_TURNS",
    "MAX_CALL_CHARS",
    "MAX_CALL_DEPTH",
    "MAX_NUMBER_DIGITS",
    "PARSERS",
    "Glm45ToolParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "Qwen3ToolParser",
    "ToolCall",
    "ToolCallParser",
    "get_parser",
    "json_bounds_problem",
    "strip_thinking",
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


def _tagged_bodies(text: str) -> tuple[list[str], list[str]]:
    """The text between each ``<tool_call>`` and its ``</tool_call>``, in order, and the error
    for a call the model left unclosed (it stopped mid-call; the scan ends there)."""
    bodies: list[str] = []
    pos = 0
    while (start := text.find(_OPEN_TAG, pos)) >= 0:
        end = text.find(_CLOSE_TAG, start + len(_OPEN_TAG))
        if end < 0:
            return bodies, [f"tool call without a closing {_CLOSE_TAG}"]
        bodies.append(text[start + len(_OPEN_TAG) : end])
        pos = end + len(_CLOSE_TAG)
    return bodies, []


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
        bodies, unclosed = _tagged_bodies(text)
        for body in bodies:
            call, error = self._one(body.strip())
            if call is not None:
                calls.append(call)
            else:
                errors.append(error or "tool call could not be read")
        return calls, errors + unclosed

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


_THINK_OPEN: Final = "<think>"
_THINK_CLOSE: Final = "</think>"


def strip_thinking(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks; an unclosed block (the model was
    still thinking when the turn ended) is dropped to the end: no call is read from thought."""
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(_THINK_OPEN, pos)
        if start < 0:
            out.append(text[pos:])
            break
        out.append(text[pos:start])
        end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end < 0:
            break
        pos = end + len(_THINK_CLOSE)
    return "".join(out)


class Qwen3ToolParser(HermesToolParser):
    """Qwen3 (thinking): Hermes ``<tool_call>`` blocks after the ``<think>...</think>`` part;
    calls written inside the thinking are not calls."""

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        return super().parse(strip_thinking(text))


class Llama3JsonToolParser(ToolCallParser):
    """Llama 3.1 / 3.2 JSON tool calling: the whole turn is ``{"name": ..., "parameters":
    {...}}`` (``"arguments"`` accepted too), optionally after ``<|python_tag|>``, several
    calls separated by ``;``. A turn that does not start with ``{`` is an answer, not a call.
    """

    _TAG: Final = "<|python_tag|>"

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        body = text.strip()
        if body.startswith(self._TAG):
            body = body[len(self._TAG) :].lstrip()
        if not body.startswith("{"):
            return [], []
        problem = json_bounds_problem(body)
        if problem is not None:
            return [], [f"tool call {problem}"]
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        while pos < len(body):
            try:
                data, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError as err:
                errors.append(f"tool call is not valid JSON: {err.msg} at char {err.pos}")
                break
            except (ValueError, RecursionError) as err:
                errors.append(f"tool call is not valid JSON ({type(err).__name__})")
                break
            call, error = self._one(data)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return calls, errors

    @staticmethod
    def _one(data: Any) -> tuple[ToolCall | None, str]:
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None, 'tool call must be a JSON object with a string "name"'
        name = data["name"]
        args = data.get("parameters", data.get("arguments", {}))
        if isinstance(args, str):
            args, problem = _loads(args)
            if problem is not None:
                return None, f"parameters of {name!r:.100} are not a JSON object ({problem})"
        if not isinstance(args, dict):
            return None, f"parameters of {name!r:.100} must be a JSON object"
        return ToolCall(name=name, arguments=args), ""

    def format_responses(self, results: Sequence[str]) -> str:
        msg = "llama3_json tool turns come from the chat template ([agent] tool_turns)"
        raise NotImplementedError(msg)


class Glm45ToolParser(ToolCallParser):
    """GLM-4.5 / 4.6 XML calls: ``<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V
    </arg_value>...</tool_call>`` (thinking stripped first). A value is kept as text where the
    tool's schema declares the parameter a string (GLM's template writes strings raw), and read
    as JSON otherwise (numbers, booleans, objects), falling back to the text."""

    def __init__(self, schemas: Sequence[Mapping[str, Any]] = ()) -> None:
        self.string_params: dict[str, set[str]] = {}
        for schema in schemas:
            props = (schema.get("parameters") or {}).get("properties") or {}
            self.string_params[str(schema.get("name"))] = {
                k for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "string"
            }

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        calls: list[ToolCall] = []
        errors: list[str] = []
        bodies, unclosed = _tagged_bodies(strip_thinking(text))
        for body in bodies:
            if len(body) > MAX_CALL_CHARS:
                errors.append(f"tool call is longer than {MAX_CALL_CHARS} characters")
                continue
            call, error = self._one(body)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
        return calls, errors + unclosed

    def _one(self, body: str) -> tuple[ToolCall | None, str]:
        cut = body.find("<arg_key>")
        name = (body if cut < 0 else body[:cut]).strip()
        if not name or "\n" in name or "<" in name:
            return None, "tool call must start with the tool's name"
        strings = self.string_params.get(name, set())
        args: dict[str, Any] = {}
        rest = "" if cut < 0 else body[cut:]
        while rest.strip():
            rest = rest.lstrip()
            if not rest.startswith("<arg_key>"):
                return None, f"arguments of {name!r:.100}: expected <arg_key>"
            k_end = rest.find("</arg_key>")
            v_start = rest.find("<arg_value>", max(k_end, 0))
            v_end = rest.find("</arg_value>", max(v_start, 0))
            if k_end < 0 or v_start < 0 or v_end < 0:
                return None, f"arguments of {name!r:.100}: unclosed <arg_key>/<arg_value>"
            if rest[k_end + len("</arg_key>") : v_start].strip():
                return None, f"arguments of {name!r:.100}: text between </arg_key> and <arg_value>"
            key = rest[len("<arg_key>") : k_end].strip()
            raw = rest[v_start + len("<arg_value>") : v_end]
            rest = rest[v_end + len("</arg_value>") :]
            if key in strings:
                args[key] = raw
                continue
            value, problem = _loads(raw)
            args[key] = raw if problem is not None else value
        return ToolCall(name=name, arguments=args), ""

    def format_responses(self, results: Sequence[str]) -> str:
        msg = "glm45 tool turns come from the chat template ([agent] tool_turns)"
        raise NotImplementedError(msg)


PARSERS: Final[dict[str, type[ToolCallParser]]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "qwen3": Qwen3ToolParser,
    "llama3_json": Llama3JsonToolParser,
    "glm45": Glm45ToolParser,
}
# The formats whose tool turn has a fixed text of its own ([agent] tool_turns = "hermes").
BUILTIN_TURNS: Final = BUILTIN_TOOL_TURNS


def get_parser(name: str, schemas: Sequence[Mapping[str, Any]] = ()) -> ToolCallParser:
    """The parser of ``[agent] tool_parser``; ``schemas``: the tools' ``schema()`` (GLM's
    format reads parameter types from them)."""
    if name == "glm45":
        return Glm45ToolParser(schemas)
    return PARSERS[name]()
