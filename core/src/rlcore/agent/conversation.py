"""One row's conversation as the agent loop grows it, and the per-batch agent metrics over them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["Conversation", "agent_metrics"]


@attrs.define
class Conversation:
    """One row's conversation as it grows: response tokens, their masks, and the counts."""

    prompt_ids: list[int]
    token_ids: list[int] = attrs.Factory(list)
    loss_mask: list[int] = attrs.Factory(list)  # 1: the model wrote it
    log_probs: list[float] = attrs.Factory(list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    malformed_calls: int = 0  # calls the parser could not read (in tool_errors too)
    tool_timeouts: int = 0  # calls killed at tool_timeout_s (in tool_errors too)
    truncated: bool = False
    generation_timeout: bool = False
    template_mismatch: bool = False  # its ids differ from the chat template's (checked ones)
    messages: list[dict[str, str]] = attrs.Factory(list)
    # [agent] environment: this conversation's episode (rlcore.agent.loop.env_step).
    env: Any = None
    task: Any = None
    env_reward: float = 0.0
    env_error: bool = False

    def append(self, ids: Sequence[int], *, model: bool, log_probs: Sequence[float] | None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([int(model)] * len(ids))
        if log_probs is not None and len(log_probs) == len(ids):
            self.log_probs.extend(log_probs)
        else:
            self.log_probs.extend([0.0] * len(ids))

    def summary(self) -> dict[str, Any]:
        return {
            "turns": list(self.messages),
            "num_turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "malformed_calls": self.malformed_calls,
            "tool_timeouts": self.tool_timeouts,
            "truncated": self.truncated,
            **({"env_reward": self.env_reward} if self.env is not None else {}),
        }


def agent_metrics(conversations: Sequence[Conversation]) -> dict[str, float]:
    """Means over conversations: ``agent/turns`` (model turns), ``agent/tool_calls``,
    ``agent/tool_errors`` (calls that raised, hung, died or did not parse), ``agent/truncated``
    (fraction cut by the token or turn budget), ``agent/tool_use_rate`` (fraction with at
    least one successful call); counts over the batch: ``agent/generation_timeouts``,
    ``agent/malformed_calls`` (calls the parser could not read) and ``agent/tool_timeouts``
    (calls killed at ``tool_timeout_s``), ``agent/template_mismatches`` (finished
    conversations whose token ids differ from the chat template's rendering of their
    messages; checked with ``[agent] tool_turns = "chat_template"``)."""
    n = max(1, len(conversations))
    return {
        "agent/turns": sum(c.turns for c in conversations) / n,
        "agent/tool_calls": sum(c.tool_calls for c in conversations) / n,
        "agent/tool_errors": sum(c.tool_errors for c in conversations) / n,
        "agent/truncated": sum(c.truncated for c in conversations) / n,
        "agent/tool_use_rate": sum(c.tool_calls > c.tool_errors for c in conversations) / n,
        "agent/generation_timeouts": float(sum(c.generation_timeout for c in conversations)),
        "agent/malformed_calls": float(sum(c.malformed_calls for c in conversations)),
        "agent/tool_timeouts": float(sum(c.tool_timeouts for c in conversations)),
        "agent/template_mismatches": float(sum(c.template_mismatch for c in conversations)),
        "agent/env_errors": float(sum(c.env_error for c in conversations)),
    }
