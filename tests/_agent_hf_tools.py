"""The tool of ``test_agent_hf.py``, in a module of its own: each call runs in a fresh process,
which imports the tool's class by module path (test modules are not importable under pytest's
importlib mode; ``tests/`` is on pytest's ``pythonpath``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcore.agent import BaseTool


class EchoTool(BaseTool):
    def schema(self) -> dict[str, Any]:
        return {"name": "echo", "description": "echo", "parameters": {"type": "object"}}

    def call(self, arguments: Mapping[str, Any]) -> str:
        return "42"
