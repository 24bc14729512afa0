"""A rollout for agent training tests: the HF rollout whose model turns are scripted.

A random tiny model writes no tool calls, so the policy's turns are written here, as the
chat family's models write them (``_chat_templates.Family``): turn 1 calls the calculator on
"a+b", and on "a-b" every other time (the ``n`` samples of a prompt start one after another,
so each group holds right and wrong calls: rewards differ and GRPO has a signal), turn 2
answers "#### <the tool's result>". Everything else is real: the
HF rollout object, the agent loop, the chat template, the tool process, the reward, the
engine's log-probs and update. In a module of its own: Ray workers import it by name.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import attrs
from _chat_templates import FAMILIES

from rlcore.hookspecs import hookimpl
from rlcore.interfaces import CONTRACT_VERSION, GenerationResult, RolloutSpec, SamplingParams
from rlcore_hf.rollout import HFRollout

contract_version = CONTRACT_VERSION

_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
_NUMBER = re.compile(r"-?\d+")


class ScriptedTurns(HFRollout):
    @attrs.frozen(kw_only=True)
    class Config(HFRollout.Config):
        family: str = attrs.field(default="qwen25", metadata={"help": "_chat_templates family."})

    def __init__(self, spec: RolloutSpec, config: Any = None) -> None:
        super().__init__(spec, config)
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(spec.model_path)
        self.family = FAMILIES[self.config.family]
        self.first_turns = 0
        self.stop = self.tok.convert_tokens_to_ids(
            self.family.stops[0] if self.family.stops else self.family.eos
        )

    async def generate_one(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> GenerationResult:
        await asyncio.sleep(0)
        text = self.tok.decode(prompt_ids, skip_special_tokens=True)
        match = list(_QUESTION.finditer(text))[-1]
        a, b = int(match.group(1)), int(match.group(2))
        if "expression" not in text[match.end() :]:  # no call after the question: turn 1
            expr = f"{a}+{b}" if self.first_turns % 2 == 0 else f"{a}-{b}"
            self.first_turns += 1
            ids = self.tok.encode(
                self.family.call("calculator", {"expression": expr}), add_special_tokens=False
            )
            return _within([*ids, self.stop], sampling)
        result = _NUMBER.findall(text)[-1]
        ids = self.tok.encode(self.family.answer(f"#### {result}"), add_special_tokens=False)
        return _within([*ids, self.tok.eos_token_id], sampling)


def _within(ids: list[int], sampling: SamplingParams) -> GenerationResult:
    """At most ``max_new_tokens``, as a real rollout: cut short, the finish reason says so."""
    out = ids[: sampling.max_new_tokens]
    return GenerationResult(token_ids=out, finish_reason="stop" if out == ids else "length")


@hookimpl
def register_rollouts() -> dict[str, str]:
    return {"scripted_turns": "_agent_scripted:ScriptedTurns"}
