"""The GSM8K-with-calculator environment: prompts, and a reward that reads the conversation."""

from __future__ import annotations

import json

from rlcore.agent.parsers import HermesToolParser
from rlcore.testing.conformance import check_reward
from rlcore_calculator.environment import GSM8KToolReward, make_row, system_prompt


def test_the_prompt_describes_the_tool_in_a_parsable_call_format():
    text = system_prompt()
    schema = json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])
    assert schema["function"]["name"] == "calculator"
    short = system_prompt("short")
    calls, errors = HermesToolParser().parse(short)
    assert errors == []
    assert calls[0].name == "calculator"
    row = make_row("What is 2 + 3?", "5", index=0, split="train")
    assert row["prompt"][0]["role"] == "system"
    assert row["reward_model"]["ground_truth"] == "5"


def test_reward_reads_the_final_model_turn_and_tool_use_from_extra_info():
    reward = GSM8KToolReward(GSM8KToolReward.Config(tool_bonus=0.1))
    turns = [
        {"role": "assistant", "content": "<tool_call>...</tool_call> #### 7"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "#### 5"},
    ]
    extra = {"turns": turns, "tool_calls": 1, "tool_errors": 0}
    # The decoded response contains every turn; only the last model turn is the answer.
    out = reward.score("gsm8k_tool", "whole text #### 7", "5", extra)
    assert out == {"score": 1.1, "acc": True, "used_tool": True}
    failed = {"turns": turns, "tool_calls": 1, "tool_errors": 1}
    assert reward.score("gsm8k_tool", "", "5", failed)["score"] == 1.0
    assert reward.score("gsm8k_tool", "#### 4", "5", None) == {
        "score": 0.0,
        "acc": False,
        "used_tool": False,
    }


def test_reward_conformance():
    check_reward(GSM8KToolReward, cases=[("#### 5", "5", 1.0), ("#### 4", "5", 0.0)])
