"""Multi-turn rollouts with tools: the agent loop, tool-call parsers and the tool contract.

Importing this package is light (no torch): :mod:`rlcore.plugins` needs :class:`BaseTool`.
"""

from __future__ import annotations

from rlcore.agent.parsers import PARSERS, HermesToolParser, ToolCall, ToolCallParser
from rlcore.interfaces import BaseTool, ToolError

__all__ = ["PARSERS", "BaseTool", "HermesToolParser", "ToolCall", "ToolCallParser", "ToolError"]
