"""``check_tool``: a tool describes itself, answers text, and fails only with ``ToolError``."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Iterable, Mapping
from typing import Any

from rlcore.interfaces import BaseTool, ToolError
from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_class, construct

__all__ = ["ADVERSARIAL_ARGUMENTS", "check_tool"]

# What a policy can put in a tool call's "arguments" (already a JSON object).
ADVERSARIAL_ARGUMENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("no arguments", {}),
    ("unexpected key", {"conformance_unknown": 1}),
    ("every value a number", {"expression": 7, "query": 7, "code": 7, "input": 7}),
    ("every value null", {"expression": None, "query": None, "code": None, "input": None}),
    ("100 kB string", {"expression": "9" * 100_000, "query": "9" * 100_000}),
    ("huge power", {"expression": "9**9**9**9**9", "query": "9**9**9**9**9"}),
    ("nested parentheses", {"expression": "(" * 5_000 + "1" + ")" * 5_000}),
    ("python code", {"expression": "__import__('os').system('true')", "code": "import os"}),
    ("non-ASCII", {"expression": "½ + ٤٢ 🙂", "query": "答案"}),
    ("control characters", {"expression": "\x00\x1b[31m1+1", "query": "\x00"}),
)


def check_tool(
    cls: type[BaseTool],
    config: BaseTool.Config | None = None,
    cases: Iterable[tuple[Mapping[str, Any], str]] = (),
    *,
    time_limit_s: float = 5.0,
) -> None:
    """Check a tool class against the :class:`~rlcore.agent.BaseTool` contract.

    Rules: the ``Config`` rules; ``schema()`` is a JSON-serialisable object with a non-empty
    string ``name``, a string ``description`` and an object ``parameters`` (a JSON schema
    with ``"type": "object"``); ``call`` returns a ``str`` or raises :class:`ToolError` (and
    nothing else) on :data:`ADVERSARIAL_ARGUMENTS`, each within ``time_limit_s``; the tool
    pickles (it is built in Ray workers). ``cases`` are ``(arguments, expected text)`` the
    author knows.
    """
    what, config = check_class(cls, BaseTool, config, "agent.tools")
    tool = construct(what, cls, config, "tool")
    _check_schema(tool, what)
    inputs: list[tuple[str, Mapping[str, Any], str | None]] = [
        (label, args, None) for label, args in ADVERSARIAL_ARGUMENTS
    ]
    inputs += [(f"case {i} {dict(a)!r:.60}", a, out) for i, (a, out) in enumerate(cases)]
    for label, arguments, expected in inputs:
        start = time.monotonic()
        try:
            result: Any = tool.call(arguments)
        except ToolError:
            result = None
        except Exception as err:  # the finding: tool input made it raise something else
            fail(
                what,
                "call must return text or raise rlcore.agent.ToolError on bad arguments",
                f"{label}: {type(err).__name__}: {err}",
            )
        elapsed = time.monotonic() - start
        if elapsed > time_limit_s:
            fail(what, f"call must return within time_limit_s={time_limit_s:g}", f"{label}")
        if result is not None and not isinstance(result, str):
            fail(what, "call must return a str", f"{label}: got {type(result).__name__}")
        if expected is not None and result != expected:
            fail(what, "call must give the author's expected text", f"{label}: got {result!r}")
    try:
        pickle.loads(pickle.dumps(tool))
    except Exception as err:  # any pickling failure is the finding
        fail(what, "the tool must pickle", f"{type(err).__name__}: {err}")


def _check_schema(tool: BaseTool, what: str) -> None:
    rule = (
        'schema() must return {"name": str, "description": str, "parameters": '
        '{"type": "object", ...}}, JSON-serialisable'
    )
    try:
        schema = tool.schema()
        json.dumps(schema)
    except Exception as err:  # plugin code; the finding
        fail(what, rule, f"{type(err).__name__}: {err}")
    if not isinstance(schema, dict):
        fail(what, rule, f"got {type(schema).__name__}")
    name = schema.get("name")
    if not isinstance(name, str) or not name:
        fail(what, rule, f"name is {name!r}")
    if not isinstance(schema.get("description"), str):
        fail(what, rule, f"description is {schema.get('description')!r}")
    params = schema.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        fail(what, rule, f"parameters is {params!r}")
