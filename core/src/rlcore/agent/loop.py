"""The agent loop: many multi-turn conversations with tools in flight, in token ids throughout.

For each prompt row: generate a model turn (``rollout.generate_one``), parse tool calls from
its decoded text, run the tools (in threads, each with a time limit), encode the tool turn
and append it, and continue until the model answers without a call, ``max_turns`` model turns
were taken, or the response budget (``max_new_tokens`` of the sampling, all turns together)
is spent. The model's tokens are appended exactly as generated: decoding is only for finding
calls, nothing the model wrote is re-encoded.

Output layout is :class:`~rlcore.interfaces.BaseRollout`'s, with one difference: the
``responses`` of a row hold every turn (model and tool) and ``response_mask`` is 1 on model
tokens only, 0 on tool-output and template tokens (no gradient, no KL), while
``attention_mask`` is 1 on all of them (the model saw them). ``non_tensor_batch["agent"]``
carries each conversation's turns and counts, for rewards (the reward manager merges it
into ``extra_info``) and for inspection.

Every wait is bounded, and model and tool output are data: a generation past
``generation_timeout_s`` ends its conversation (flagged truncated, counted); a call the parser
cannot read (``agent/malformed_calls``), a tool that raises (``BaseException`` included) or
whose process dies, and one past ``tool_timeout_s`` (killed, ``agent/tool_timeouts``) each
return an error message to the model and are counted in ``agent/tool_errors``; the
conversation goes on and the batch's others are untouched. Each tool call runs in a process
of its own (:mod:`rlcore.agent.tool_processes`), waited for from a daemon thread so that
neither the event loop nor ``asyncio.run`` blocks on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.agent.conversation import Conversation, agent_metrics
from rlcore.agent.parsers import ToolCall, get_parser
from rlcore.agent.template import ChatTemplateTurns, tool_schemas
from rlcore.agent.tool_processes import TIMEOUT, TOOL_ERROR, ToolProcesses
from rlcore.interfaces import BaseEnvironment, BaseTool

if TYPE_CHECKING:
    from rlcore.config.schema import AgentConfig
    from rlcore.interfaces import BaseRollout, SamplingParams
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = ["AgentLoop", "Conversation"]


def env_step(conv: Conversation, text: str) -> str | None:
    """Step ``conv``'s environment with the model's turn (``reset`` first, on the first
    turn); its observation, or None when the episode is over. A ``reset``/``step`` that
    raises ends the conversation with no gradient (``agent/env_errors``, one log line)."""
    env = conv.env
    try:
        if conv.turns == 1:
            env.reset(conv.task)
        observation, reward, terminated, truncated, _info = env.step(text)
    except Exception as err:
        log.warning("agent: %s; that sample gets no gradient", err)
        conv.env_error = True
        conv.loss_mask = [0] * len(conv.loss_mask)
        return None
    conv.env_reward += float(reward)
    return None if terminated or truncated else str(observation)


def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """``fn(*args)`` in a new daemon thread, as a future of this event loop.

    Not the loop's default executor: ``asyncio.run`` joins its threads on exit, so one hung
    tool would hold up the whole batch.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # the caller gave up (timeout) already
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value = fn(*args)
        except BaseException as err:  # handed to the awaiting coroutine, which reports it
            error: BaseException | None = err
            value = None
        else:
            error = None
        # RuntimeError: the event loop closed while the tool ran; nobody waits for it.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name="rlcore-agent-tool", daemon=True).start()
    return future


class AgentLoop:
    """Runs :meth:`generate` (a batch in, the rollout layout out) over ``generate_one``.

    ``tokenizer``: a Hugging Face tokenizer of the policy (decode turns, encode tool turns);
    ``tools``: built tool instances; ``config``: the ``[agent]`` section.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[BaseTool],
        config: AgentConfig,
        environment: Callable[[], BaseEnvironment] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        # [agent] environment: one per conversation, stepped with each model turn's text
        # (env_step below); its observation is the next tool turn.
        self.environment = environment
        self.config = config
        self.weight_version = 0  # set by the rollout worker; the harness loop records it
        self.tools: dict[str, BaseTool] = {}
        for tool in tools:
            self.tools[tool.name] = tool
        schemas = [t.schema() for t in self.tools.values()]
        self.parser = get_parser(config.tool_parser, schemas)
        # The tool turns from the tokenizer's chat template, or Qwen2.5's fixed text.
        self.turns = (
            ChatTemplateTurns(tokenizer, tool_schemas(list(self.tools.values())))
            if config.turns() == "chat_template"
            else None
        )
        self.special_ids = {int(t) for t in getattr(tokenizer, "all_special_ids", ()) or ()}
        self.processes = ToolProcesses(self.tools)  # pickles each tool once: fails here
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else tokenizer.eos_token_id)

    # --- the batch face -------------------------------------------------------------------

    def generate(
        self, rollout: BaseRollout, prompts: DataProto, sampling: SamplingParams
    ) -> DataProto:
        """Left-padded prompts in (``input_ids``, ``attention_mask``[, ``position_ids``])."""
        # Our own loop and default executor (where BaseRollout's generate_one runs its
        # threads): asyncio.run would join those threads on exit, so a generation that hung
        # past generation_timeout_s would hold the batch forever.
        loop = asyncio.new_event_loop()
        executor = ThreadPoolExecutor(thread_name_prefix="rlcore-agent-generate")
        loop.set_default_executor(executor)
        try:
            conversations = loop.run_until_complete(self.run(rollout, prompts, sampling))
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            loop.close()
        return self.to_dataproto(prompts, conversations, sampling)

    async def run(
        self, rollout: BaseRollout, prompts: DataProto, sampling: SamplingParams
    ) -> list[Conversation]:
        ids = prompts.batch["input_ids"]
        mask = prompts.batch["attention_mask"].bool()
        conversations = [
            Conversation(prompt_ids=[int(t) for t in ids[i][mask[i]]]) for i in range(len(ids))
        ]
        if self.environment is not None:
            from rlcore.agent.harness import tasks_of

            for conv, task in zip(conversations, tasks_of(prompts, self.tokenizer), strict=True):
                conv.env = self.environment()
                conv.task = task
        # Bound what is in flight: each conversation holds a request (and KV cache) open.
        limit = asyncio.Semaphore(self.config.max_parallel_conversations)

        async def one(conv: Conversation) -> None:
            async with limit:
                await self._converse(rollout, conv, sampling)

        await asyncio.gather(*(one(c) for c in conversations))
        if self.turns is not None:
            for conv in conversations:
                if not conv.truncated:  # a cut conversation has no template rendering to match
                    conv.template_mismatch = self.turns.mismatch(
                        conv.token_ids, conv.messages, self.special_ids
                    )
            mismatched = sum(c.template_mismatch for c in conversations)
            if mismatched:
                log.warning(
                    "agent: %d of %d conversations differ from the chat template's tokens "
                    "(agent/template_mismatches); check [agent] tool_parser and the template",
                    mismatched,
                    len(conversations),
                )
        return conversations

    # --- one conversation -----------------------------------------------------------------

    async def _converse(
        self, rollout: BaseRollout, conv: Conversation, sampling: SamplingParams
    ) -> None:
        cfg = self.config
        budget = sampling.max_new_tokens  # all turns together: the response length R
        while True:
            remaining = budget - len(conv.token_ids)
            if remaining <= 0:
                conv.truncated = True
                return
            cap = remaining
            if cfg.max_tokens_per_turn is not None:
                cap = min(cap, cfg.max_tokens_per_turn)
            turn_sampling = attrs.evolve(sampling, max_new_tokens=cap)
            try:
                result = await asyncio.wait_for(
                    rollout.generate_one(conv.prompt_ids + conv.token_ids, turn_sampling),
                    timeout=cfg.generation_timeout_s,
                )
            except TimeoutError:
                log.warning(
                    "agent: a model turn ran past [agent] generation_timeout_s=%s; "
                    "conversation truncated",
                    cfg.generation_timeout_s,
                )
                conv.truncated = conv.generation_timeout = True
                return
            tokens = list(result.token_ids)[:cap]
            log_probs = None if result.log_probs is None else list(result.log_probs)[:cap]
            conv.turns += 1
            conv.append(tokens, model=True, log_probs=log_probs)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            conv.messages.append({"role": "assistant", "content": text})
            cut = result.finish_reason == "length"
            if cut and len(conv.token_ids) >= budget:
                conv.truncated = True
                return
            if conv.env is not None:  # the environment answers instead of tools
                observation = env_step(conv, text)
                if observation is None or conv.turns >= cfg.max_turns:
                    return
                results = [observation]
                conv.messages.append({"role": "tool", "content": observation})
                if not self._append_tool_turn(conv, results, tokens, cut, budget):
                    return
                continue
            # A turn cut by max_tokens_per_turn is parsed too: its call may be complete.
            calls, errors = self._parse(text)
            if not calls and not errors:
                conv.truncated = cut  # a final answer, unless it was cut off
                return
            if conv.turns >= cfg.max_turns:
                conv.truncated = True  # it wanted a tool, but the turn budget is spent
                return
            results = [f"error: {e}" for e in errors]
            conv.tool_errors += len(errors)
            conv.tool_calls += len(errors)
            conv.malformed_calls += len(errors)
            extra = calls[cfg.max_parallel_calls :]
            calls = calls[: cfg.max_parallel_calls]
            outcomes = await asyncio.gather(*(self._call_tool(c) for c in calls))
            for text_out, ok, timed_out in outcomes:
                results.append(text_out)
                conv.tool_calls += 1
                conv.tool_errors += int(not ok)
                conv.tool_timeouts += int(timed_out)
            if extra:
                results.append(
                    f"error: at most {cfg.max_parallel_calls} tool calls per turn; "
                    f"{len(extra)} ignored"
                )
            for r in results:
                conv.messages.append({"role": "tool", "content": r})
            if not self._append_tool_turn(conv, results, tokens, cut, budget):
                return

    def _append_tool_turn(
        self, conv: Conversation, results: list[str], tokens: list[int], cut: bool, budget: int
    ) -> bool:
        """Encode and append the tool turn; False when it filled the budget (conversation cut)."""
        if self.turns is not None:
            stop = tokens[-1] if tokens and not cut and tokens[-1] in self.special_ids else None
            stop_text = None if stop is None else self.tokenizer.decode([stop])
            tool_ids = self._encode(self.turns.tool_turn(results, stop_text=stop_text))
        else:
            tool_ids = self._encode(self.parser.format_responses(results))
        room = budget - len(conv.token_ids)
        if len(tool_ids) >= room:
            # No room left for the model to answer after the tool turn: cut and flag.
            conv.append(tool_ids[:room], model=False, log_probs=None)
            conv.truncated = True
            return False
        conv.append(tool_ids, model=False, log_probs=None)
        return True

    def _parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        try:
            return self.parser.parse(text)
        except Exception as err:  # the parsers return errors; this keeps any slip per-turn
            log.warning("agent: the tool-call parser raised %s: %s", type(err).__name__, err)
            return [], [f"tool calls could not be read ({type(err).__name__})"]

    async def _call_tool(self, call: ToolCall) -> tuple[str, bool, bool]:
        """(text shown to the model, whether the call succeeded, whether it was killed at
        ``tool_timeout_s``); never raises."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return f"error: unknown tool {call.name!r:.100}; available: {known}", False, False
        limit = self.config.max_tool_response_length
        # Bounded inside (start-up, the tool's limit, the kill): no second timeout here.
        outcome = await _in_daemon_thread(
            lambda: self.processes.call(
                call.name, call.arguments, timeout_s=self.config.tool_timeout_s, max_chars=limit
            )
        )
        if not outcome.ok:
            if outcome.kind != TOOL_ERROR:  # the tool's own answer to bad arguments
                log.warning("agent: %s", outcome.text)
            return f"error: {outcome.text}", False, outcome.kind == TIMEOUT
        return self._clip(outcome.text), True, False

    def _clip(self, text: str) -> str:
        limit = self.config.max_tool_response_length
        return text if len(text) <= limit else text[:limit] + " ...(truncated)"

    def _encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    # --- tensors --------------------------------------------------------------------------

    def to_dataproto(
        self,
        prompts: DataProto,
        conversations: Sequence[Conversation],
        sampling: SamplingParams,
    ) -> DataProto:
        import numpy as np
        import torch

        from rlcore.engine import position_ids_from_mask, rollout_tensors
        from rlcore.protocol import DataProto

        prompt_ids = prompts.batch["input_ids"]  # (B, P) left-padded
        prompt_mask = prompts.batch["attention_mask"]
        prompt_pos = prompts.batch.get("position_ids")
        if prompt_pos is None:
            prompt_pos = position_ids_from_mask(prompt_mask)
        B, R = len(conversations), sampling.max_new_tokens
        responses = torch.full((B, R), self.pad_token_id, dtype=prompt_ids.dtype)
        response_mask = torch.zeros(B, R, dtype=torch.long)  # model tokens only
        seen = torch.zeros(B, R, dtype=prompt_mask.dtype)  # every real token, tool turns too
        log_probs = torch.zeros(B, R, dtype=torch.float32)
        for i, conv in enumerate(conversations):
            n = len(conv.token_ids)
            responses[i, :n] = torch.tensor(conv.token_ids, dtype=prompt_ids.dtype)
            response_mask[i, :n] = torch.tensor(conv.loss_mask, dtype=torch.long)
            seen[i, :n] = 1
            log_probs[i, :n] = torch.tensor(conv.log_probs, dtype=torch.float32)
        tensors = rollout_tensors(
            prompt_ids, prompt_mask, prompt_pos, responses, response_mask,
            log_probs=log_probs if sampling.return_log_probs else None,
            response_attention=seen,
        )  # fmt: skip
        agent = np.empty(B, dtype=object)
        for i, conv in enumerate(conversations):
            agent[i] = conv.summary()
        metrics: Mapping[str, float] = agent_metrics(conversations)
        return DataProto.from_dict(
            tensors=tensors,
            non_tensors={"agent": agent},
            meta_info={"metrics": {k: [v] for k, v in metrics.items()}},
        )
