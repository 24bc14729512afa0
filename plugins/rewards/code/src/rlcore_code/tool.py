"""The ``code_interpreter`` tool: ``{"code": "print(6 * 7)"}`` -> ``"42"``, in the sandbox.

Every call is a fresh sandbox (:mod:`rlcore_code.sandbox`): no state carries from one call
to the next, nothing the code does reaches the host. The answer is the merged standard
output and error, cut to ``max_chars``, with a last line saying how the run ended when it did
not end normally (``[exit status 1]``, ``[timed out after 3 s]``, ``[output cut at ...]``).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

import attrs

from rlcore.agent import BaseTool, ToolError
from rlcore.interfaces import key
from rlcore_code.sandbox import SandboxOptions, run_in_sandbox

__all__ = ["CodeInterpreterTool"]


class CodeInterpreterTool(BaseTool):
    """Runs model-written Python in the sandbox and shows what it printed.

    The code is never run in this process: it goes to a bubblewrap sandbox with no network,
    a read-only system, a private ``/tmp`` and limits on CPU, memory, processes, files and
    output (``SandboxOptions``). Keep ``sandbox.timeout_s`` below ``[agent] tool_timeout_s``.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseTool.Config):
        """Options of the ``code_interpreter`` tool."""

        name: str = key(
            "code_interpreter", "The name the model calls the tool by (its schema's name)."
        )
        sandbox: SandboxOptions = attrs.field(factory=SandboxOptions)
        max_chars: int = key(
            4000,
            "Characters of the program's output shown to the model; at most 10**7.",
            validator=[attrs.validators.gt(0), attrs.validators.le(10_000_000)],
            allowed="> 0, <= 10000000",
        )

    def __init__(self, config: CodeInterpreterTool.Config | None = None) -> None:
        super().__init__(config)
        self.config: CodeInterpreterTool.Config

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "description": (
                "Run a Python 3 program in a fresh sandbox (standard library only, no network, "
                "no files kept between calls) and return what it prints."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "e.g. print(sum(range(10)))"}
                },
                "required": ["code"],
            },
        }

    def call(self, arguments: Mapping[str, Any]) -> str:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            msg = 'code_interpreter needs {"code": "<python program>"}'
            raise ToolError(msg)
        options = self.config.sandbox
        result = run_in_sandbox(options, {"mode": "run", "token": "", "code": code})
        text = result.output.decode(errors="replace")
        if len(text) > self.config.max_chars:
            text = text[: self.config.max_chars] + "\n..."
        status = ""
        if result.output_exceeded:
            status = f"[output cut at {options.max_output_bytes} bytes; the program was stopped]"
        elif result.timed_out:
            status = f"[timed out after {options.timeout_s:g} s]"
        elif result.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            status = f"[stopped: CPU time limit of {options.cpu_s} s]"
        elif result.returncode:
            status = f"[exit status {result.returncode}]"
        if status:
            text = f"{text.rstrip()}\n{status}" if text.strip() else status
        return text.rstrip("\n") if text.strip() else "[no output]"
