"""The ``[agent]`` section: multi-turn rollouts with tools (:mod:`rlcore.agent`)."""

from __future__ import annotations

from typing import Any, Final

import attrs
from attrs import validators as v

from rlcore.config.fields import _opt_pos, _pos
from rlcore.interfaces import (
    POLL_MAX_S,
    key,
    seconds,
)

# The tool-call formats whose tool turn has a fixed text of its own (Qwen2.5's template's),
# usable without the tokenizer's chat template ([agent] tool_turns = "hermes").
BUILTIN_TOOL_TURNS: Final = frozenset({"hermes", "qwen", "qwen3"})


@attrs.frozen(kw_only=True)
class AgentConfig:
    """``[agent]``: multi-turn rollouts with tools (:mod:`rlcore.agent`); absent: single-turn.

    ``tools`` names tool plugins (``register_tools``). The response budget of a conversation,
    all turns together, is ``data.max_response_length``; ``max_turns`` counts model turns
    (verl's ``max_assistant_turns``). ``max_parallel_calls`` (calls run per turn) and
    ``max_tool_response_length`` (characters of a tool's answer kept) are verl's names;
    ``tool_parser`` is verl's ``format``.
    """

    tools: tuple[str, ...] = key((), "Tool plugins the model may call (`rlcore plugins`).")
    tool_parser: str = key(
        "hermes",
        "How tool calls are read from the model's text (verl's format): hermes/qwen "
        "(<tool_call>{json}</tool_call>), qwen3 (the same after <think>...</think>), "
        'llama3_json (the turn is {"name": ..., "parameters": {...}}), glm45 '
        "(<tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value></tool_call>).",
        validator=v.in_(("hermes", "qwen", "qwen3", "llama3_json", "glm45")),
    )
    tool_turns: str = key(
        "auto",
        "How the tools and tool turns are written: chat_template (the tokenizer's "
        "template with tools=: the tool schemas in the prompt, each tool turn as the "
        "template renders role 'tool'); hermes (Qwen2.5's fixed text, tool schemas left "
        "to the data's system prompt); auto: hermes for tool_parser hermes/qwen, else "
        "chat_template.",
        validator=v.in_(("auto", "chat_template", "hermes")),
    )
    max_turns: int = key(
        4, "Model turns per conversation (verl's max_assistant_turns).", validator=_pos
    )
    max_tokens_per_turn: int | None = key(
        None,
        "Most tokens one model turn generates; unset: what is left of data.max_response_length.",
        validator=_opt_pos,
    )
    max_parallel_calls: int = key(4, "Tool calls run per model turn.", validator=_pos)
    max_parallel_conversations: int = key(256, "Conversations in flight at once.", validator=_pos)
    tool_timeout_s: float = key(
        5.0,
        "Time limit of one tool call (s).",
        validator=seconds(POLL_MAX_S, "the tool's pipe is polled, a C int of ms"),
    )
    generation_timeout_s: float = key(
        600.0,
        "Time limit of one model turn (s); past it the conversation ends, flagged truncated.",
        validator=seconds(holder="asyncio.wait_for"),
    )
    max_tool_response_length: int = key(
        1000, "Characters of a tool's answer kept in the conversation.", validator=_pos
    )
    # --- agents as black boxes: a harness behind the OpenAI-compatible endpoint (issue 46)
    harness: str | None = key(
        None,
        "A harness plugin (register_harnesses) that runs agent code against an "
        "OpenAI-compatible endpoint on each rollout replica instead of the built-in loop; "
        "samples are assembled from the endpoint's recorded tokens (rlcore.agent.harness).",
    )
    environment: str | None = key(
        None,
        "An environment plugin (register_environments, reset/step) given to each sample: "
        "harnesses get it on their task, the built-in loop steps it with each model turn.",
    )
    harness_isolation: str = key(
        "process",
        "process: each harness run in a child process (killed at harness_timeout_s, "
        "address space capped at harness_memory_mb); thread: in the worker, abandoned at "
        "the timeout (its session closed).",
        validator=v.in_(("process", "thread")),
    )
    harness_timeout_s: float = key(
        300.0,
        "Time limit of one harness run (one sample, all its calls) (s).",
        validator=seconds(holder="the harness's wait"),
    )
    harness_memory_mb: int = key(
        4096, "Address-space limit of a harness child process (MiB).", validator=_pos
    )
    max_calls_per_sample: int = key(
        32, "Endpoint calls one sample may make; later ones are refused (429).", validator=_pos
    )
    request_timeout_s: float = key(
        120.0,
        "Time limit of one endpoint call's generation (s); past it the call is answered 504.",
        validator=seconds(holder="asyncio.wait_for"),
    )
    max_request_bytes: int = key(
        1 << 20,
        "Largest endpoint request body (bytes); larger ones are refused (413).",
        validator=_pos,
    )
    options: dict[str, Any] = key(
        help="[agent.options.NAME]: each selected tool's, harness's or environment's "
        "own options (listed per plugin below); it is built with them.",
        factory=dict,
    )

    def turns(self) -> str:
        """``tool_turns`` with ``auto`` resolved: ``"chat_template"`` or ``"hermes"``."""
        if self.tool_turns != "auto":
            return self.tool_turns
        return "hermes" if self.tool_parser in ("hermes", "qwen") else "chat_template"
