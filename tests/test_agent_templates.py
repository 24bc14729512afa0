"""Tool calls through the tokenizer's chat template, token-exact, on three chat layouts built
here (``_chat_templates.py``: Qwen2.5/Hermes, Llama 3.1 JSON, GLM-4.5 XML; no Hub).

For each: the agent loop's conversation (prompt + model turns + tool turns) has exactly the
token ids of ``apply_chat_template`` over the same messages with the same ``tools``; the call
is read by the family's parser; the loop's own check (``agent/template_mismatches``) agrees.
Model turns come from a scripted rollout (a random tiny model writes no calls); the template
rendering, parsing, masks and the tool call are real.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from _chat_templates import FAMILIES

from rlcore.agent.loop import AgentLoop
from rlcore.agent.parsers import (
    Glm45ToolParser,
    HermesToolParser,
    Llama3JsonToolParser,
    Qwen3ToolParser,
    ToolCall,
)
from rlcore.agent.template import tool_schemas
from rlcore.config import AgentConfig
from rlcore.interfaces import BaseRollout, GenerationResult, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto

PROMPT = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 1+2?"},
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    from rlcore.testing.tiny_model import build_tiny_model

    out = {}
    for name, fam in FAMILIES.items():
        path = build_tiny_model(
            tmp_path_factory.mktemp(name), hidden=64, layers=1, heads=2, **fam.model_kwargs()
        )
        out[name] = AutoTokenizer.from_pretrained(path)
    return out


@pytest.fixture(params=sorted(FAMILIES))
def family(request, tokenizers):
    return FAMILIES[request.param], tokenizers[request.param]


class Scripted(BaseRollout):
    """Replays ``turns[k]`` as the k-th model turn (one conversation)."""

    def __init__(self, turns: list[list[int]]) -> None:
        super().__init__(RolloutSpec(model_path="-"))
        self.turns = turns
        self.prompts: list[list[int]] = []

    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        raise NotImplementedError

    def update_weights(self, named_tensors: Any) -> None:
        pass

    async def generate_one(self, prompt_ids, sampling) -> GenerationResult:
        await asyncio.sleep(0)
        tokens = self.turns[len(self.prompts)]
        self.prompts.append(list(prompt_ids))
        return GenerationResult(
            token_ids=tokens, log_probs=[-0.5] * len(tokens), finish_reason="stop"
        )


def _ids(tok, text: str) -> list[int]:
    return [int(t) for t in tok.encode(text, add_special_tokens=False)]


def _run(fam, tok, *, parser: str, tool_turns: str, call: str):
    from rlcore_calculator.tool import CalculatorTool

    tool = CalculatorTool()
    schemas = tool_schemas([tool])
    prompt = _ids(
        tok,
        tok.apply_chat_template(PROMPT, tools=schemas, add_generation_prompt=True, tokenize=False),
    )
    stop = tok.convert_tokens_to_ids(fam.stops[0] if fam.stops else fam.eos)
    answer = fam.answer("#### 3")
    rollout = Scripted([[*_ids(tok, call), stop], [*_ids(tok, answer), tok.eos_token_id]])
    config = AgentConfig(tools=("calculator",), tool_parser=parser, tool_turns=tool_turns)
    loop = AgentLoop(tok, [tool], config)
    n = len(prompt)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([prompt]),
            "attention_mask": torch.ones(1, n, dtype=torch.long),
            "position_ids": torch.arange(n).unsqueeze(0),
        }
    )
    out = loop.generate(rollout, batch, SamplingParams(max_new_tokens=400))
    messages = [*PROMPT, {"role": "assistant", "content": call}, {"role": "tool", "content": "3"}]
    messages.append({"role": "assistant", "content": answer})
    return out, prompt, messages, schemas, rollout


def test_a_tool_conversation_is_token_exact_with_the_chat_template(family):
    fam, tok = family
    call = fam.call("calculator", {"expression": "1+2"})
    out, prompt, messages, schemas, rollout = _run(
        fam, tok, parser=fam.parser, tool_turns="chat_template", call=call
    )
    summary = out.non_tensor_batch["agent"][0]
    assert (summary["tool_calls"], summary["tool_errors"], summary["num_turns"]) == (1, 0, 2)
    assert summary["turns"][1] == {"role": "tool", "content": "3"}  # the calculator answered
    seen = out.batch["attention_mask"][0, len(prompt) :].bool()
    response = out.batch["responses"][0][seen].tolist()
    full = _ids(tok, tok.apply_chat_template(messages, tools=schemas, tokenize=False))
    ours = prompt + response
    if ours[-1] in tok.all_special_ids and full[len(ours) - 1 : len(ours)] != ours[-1:]:
        ours = ours[:-1]  # GLM: a turn ends on the next role's token, which the template omits
    assert full[: len(ours)] == ours, tok.decode(full[len(ours) - 20 : len(ours) + 20])
    assert not tok.decode(full[len(ours) :], skip_special_tokens=True).strip()
    # The second request is the conversation so far: the template's tool turn after the call.
    assert rollout.prompts[1] == ours[: len(rollout.prompts[1])]
    mask = out.batch["response_mask"][0][seen].tolist()
    n_call, n_answer = len(rollout.turns[0]), len(rollout.turns[1])
    assert mask[:n_call] == [1] * n_call
    assert mask[-n_answer:] == [1] * n_answer
    assert sum(mask) == n_call + n_answer  # the tool turn is masked out of the loss
    assert out.meta_info["metrics"]["agent/template_mismatches"] == [0.0]


def test_the_tools_are_in_the_prompt(family):
    _, tok = family
    from rlcore_calculator.tool import CalculatorTool

    text = tok.apply_chat_template(
        PROMPT, tools=tool_schemas([CalculatorTool()]), add_generation_prompt=True, tokenize=False
    )
    assert '"name": "calculator"' in text
    assert "Evaluate an arithmetic expression" in text


@pytest.mark.parametrize("name", ["qwen25", "llama31"])
def test_fixed_hermes_turns_are_checked_against_the_template(tokenizers, name):
    """Qwen2.5's fixed tool-turn text (tool_turns = "hermes") is what Qwen2.5's template
    renders and not Llama 3.1's: why tool turns come from the template; a Hermes-style call
    on a Llama template through the template's turns stays token-exact."""
    fam, tok = FAMILIES[name], tokenizers[name]
    call = FAMILIES["qwen25"].call("calculator", {"expression": "1+2"})
    out, *_ = _run(fam, tok, parser="hermes", tool_turns="chat_template", call=call)
    assert out.meta_info["metrics"]["agent/template_mismatches"] == [0.0]
    from rlcore.agent.template import ChatTemplateTurns

    turns = ChatTemplateTurns(tok)
    summary = out.non_tensor_batch["agent"][0]
    hermes = HermesToolParser().format_responses(["3"])
    rendered = turns.tool_turn(["3"], stop_text=fam.eos)
    assert (hermes == rendered) is (name == "qwen25"), (hermes, rendered)
    assert summary["tool_calls"] == 1


# --- parsers --------------------------------------------------------------------------------


def test_llama3_json_calls():
    p = Llama3JsonToolParser()
    assert p.parse('{"name": "add", "parameters": {"a": 1}}') == (
        [ToolCall(name="add", arguments={"a": 1})],
        [],
    )
    calls, errors = p.parse('<|python_tag|>{"name": "a", "arguments": "{}"}; {"name": "b"}')
    assert [c.name for c in calls] == ["a", "b"]
    assert errors == []
    assert p.parse("The answer is 3.") == ([], [])  # an answer, not a call
    calls, errors = p.parse('{"name": "add", "parameters": {"a": 1}')
    assert calls == []
    assert "not valid JSON" in errors[0]
    assert p.parse('{"parameters": {}}')[1] == [
        'tool call must be a JSON object with a string "name"'
    ]
    assert "deeper" in p.parse("{" + '"a":[' * 40 + "]" * 40 + "}")[1][0]


def test_qwen3_calls_after_thinking():
    p = Qwen3ToolParser()
    text = '<think>maybe <tool_call>{"name": "no"}</tool_call></think>\n'
    text += '<tool_call>{"name": "yes"}</tool_call>'
    assert [c.name for c in p.parse(text)[0]] == ["yes"]
    assert p.parse('<think>still <tool_call>{"name": "no"}</tool_call>') == ([], [])


def test_glm45_calls_use_the_schema_for_string_values():
    from rlcore_calculator.tool import CalculatorTool

    p = Glm45ToolParser([CalculatorTool().schema(), {"name": "n", "parameters": {}}])
    text = (
        "\n<think>x</think>\n<tool_call>calculator\n<arg_key>expression</arg_key>\n"
        "<arg_value>12</arg_value>\n</tool_call><tool_call>n\n<arg_key>k</arg_key>\n"
        '<arg_value>{"a": [1, 2]}</arg_value>\n<arg_key>s</arg_key><arg_value>plain</arg_value>'
        "</tool_call>"
    )
    calls, errors = p.parse(text)
    assert errors == []
    assert calls == [
        ToolCall(name="calculator", arguments={"expression": "12"}),  # declared a string
        ToolCall(name="n", arguments={"k": {"a": [1, 2]}, "s": "plain"}),
    ]
    assert p.parse("<tool_call>calc\n<arg_key>a</arg_key>")[1][0].startswith("tool call without")
    bad = "<tool_call>calc<arg_key>a</arg_key>zz<arg_value>1</arg_value></tool_call>"
    assert "text between" in p.parse(bad)[1][0]
