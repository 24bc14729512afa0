"""Sandboxed code execution for rlcore: the ``code`` reward and the ``code_interpreter`` tool."""

from __future__ import annotations

from rlcore_code.extract import extract_code
from rlcore_code.reward import CodeReward
from rlcore_code.sandbox import SandboxOptions, check_sandbox, run_in_sandbox
from rlcore_code.tool import CodeInterpreterTool

__all__ = [
    "CodeInterpreterTool",
    "CodeReward",
    "SandboxOptions",
    "check_sandbox",
    "extract_code",
    "run_in_sandbox",
]
