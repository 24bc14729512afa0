"""Per-batch agent metrics, from the per-conversation outcomes of :mod:`rlcore.agent.loop`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlcore.agent.loop import Conversation

__all__ = ["agent_metrics"]


def agent_metrics(conversations: Sequence[Conversation]) -> dict[str, float]:
    """Means over conversations: ``agent/turns`` (model turns), ``agent/tool_calls``,
    ``agent/tool_errors`` (calls that raised, hung, or did not parse), ``agent/truncated``
    (fraction cut by the token or turn budget), ``agent/tool_use_rate`` (fraction with at
    least one successful call) and ``agent/generation_timeouts`` (count)."""
    n = max(1, len(conversations))
    return {
        "agent/turns": sum(c.turns for c in conversations) / n,
        "agent/tool_calls": sum(c.tool_calls for c in conversations) / n,
        "agent/tool_errors": sum(c.tool_errors for c in conversations) / n,
        "agent/truncated": sum(c.truncated for c in conversations) / n,
        "agent/tool_use_rate": sum(c.tool_calls > c.tool_errors for c in conversations) / n,
        "agent/generation_timeouts": float(sum(c.generation_timeout for c in conversations)),
    }
