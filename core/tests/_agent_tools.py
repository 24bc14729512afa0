"""Tools for the agent-loop tests, in a module of their own: each call runs in a fresh process
(forkserver), which imports the tool's class by module path, and pytest's importlib mode does
not make test modules importable. ``test_agent_loop.py`` puts this folder on ``sys.path``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlcore.agent import BaseTool, ToolError


class AddTool(BaseTool):
    def __init__(self, name: str = "add") -> None:
        super().__init__()
        self.tool_name = name

    def schema(self) -> dict[str, Any]:
        return {"name": self.tool_name, "description": "a + b", "parameters": {"type": "object"}}

    def call(self, arguments: Mapping[str, Any]) -> str:
        if "a" not in arguments:
            raise ToolError("add needs a and b")
        return str(arguments["a"] + arguments["b"])


class BrokenTool(AddTool):
    def call(self, arguments: Mapping[str, Any]) -> str:
        raise RuntimeError("disk on fire")


class SleepingTool(AddTool):
    def call(self, arguments: Mapping[str, Any]) -> str:
        time.sleep(60)
        return "late"


class ExitingTool(AddTool):
    def call(self, arguments: Mapping[str, Any]) -> str:
        raise SystemExit(3)


class InterruptingTool(AddTool):
    def call(self, arguments: Mapping[str, Any]) -> str:
        raise KeyboardInterrupt


class StuckInCTool(AddTool):
    """Writes its process id to ``pid_file``, then holds the GIL in one C call for minutes:
    ``sum`` over a range of small ints runs in C without checking for signals or threads."""

    def __init__(self, pid_file: Path, name: str = "add") -> None:
        super().__init__(name)
        self.pid_file = pid_file

    def call(self, arguments: Mapping[str, Any]) -> str:
        self.pid_file.write_text(str(os.getpid()))
        return str(sum(range(10**12)))


class DyingTool(AddTool):
    def call(self, arguments: Mapping[str, Any]) -> str:
        os._exit(7)


class NotTextTool(AddTool):
    def call(self, arguments: Mapping[str, Any]) -> str:
        return 42  # type: ignore[return-value]
