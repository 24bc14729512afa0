"""The agent loop on the tiny model's tokenizer: masks, exact model tokens, bounded failures.

Model turns come from a scripted rollout (a real :class:`BaseRollout` whose ``generate_one``
replays fixed token ids), because a random tiny model never writes a tool call; the loop is
what is under test. ``test_agent_loop_hf.py`` runs the loop on the real HF rollout.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rlcore.agent.loop import AgentLoop
from rlcore.config import AgentConfig
from rlcore.interfaces import (
    BaseReward,
    BaseRollout,
    GenerationResult,
    RolloutSpec,
    SamplingParams,
)
from rlcore.protocol import DataProto

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _agent_tools import (  # importable by the tools' processes
    AddTool,
    BrokenTool,
    DyingTool,
    ExitingTool,
    InterruptingTool,
    NotTextTool,
    SleepingTool,
    StuckInCTool,
)

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from rlcore.testing.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tok"), hidden=64, layers=1, heads=2)
    return AutoTokenizer.from_pretrained(path)


class ScriptedRollout(BaseRollout):
    """Replays ``turns[k]`` as the k-th model turn of every conversation."""

    def __init__(self, turns: list[list[int]], *, delay_s: float = 0.0) -> None:
        super().__init__(RolloutSpec(model_path="-"))
        self.turns = turns
        self.delay_s = delay_s
        self.seen_prompts: list[list[int]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        raise NotImplementedError

    def update_weights(self, named_tensors: Any) -> None:
        pass

    def script(self, prompt_ids: list[int]) -> list[list[int]]:
        return self.turns

    async def generate_one(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> GenerationResult:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        self.seen_prompts.append(list(prompt_ids))
        # The turn index, from the conversation itself: the prompt holds one <|im_end|>
        # (id 2), and each model turn plus tool turn adds two.
        k = (prompt_ids.count(2) - 1) // 2
        turns = self.script(prompt_ids)
        tokens = turns[min(k, len(turns) - 1)]
        out = tokens[: sampling.max_new_tokens]
        reason = "length" if len(out) < len(tokens) or out[-1] != 2 else "stop"
        logp = [-0.5 - 0.01 * i for i in range(len(out))]
        return GenerationResult(token_ids=out, log_probs=logp, finish_reason=reason)


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _prompts(tok, n: int = 2, pad_to: int = 24) -> DataProto:
    rows = [
        _ids(tok, f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\n") for i in range(n)
    ]
    ids = torch.zeros(n, pad_to, dtype=torch.long)
    mask = torch.zeros(n, pad_to, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, pad_to - len(r) :] = torch.tensor(r)
        mask[i, pad_to - len(r) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    )


def _sampling(max_new: int = 200) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, return_log_probs=True)


def test_tool_turn_is_masked_and_model_tokens_are_kept_exactly(tokenizer):
    tok = tokenizer
    # The first turn holds ids that do not survive decode -> encode: a lone 0xff byte and the
    # pad token mid-turn. If the loop re-encoded the model's text, they would change.
    odd = [3 + 0xFF, 0]  # the byte-level tokenizer: id 3 + b for byte b; 0 is the pad token
    turn1 = _ids(tok, "thinking ") + odd + _ids(tok, CALL) + [2]
    turn2 = [*_ids(tok, "#### 5"), 2]
    rollout = ScriptedRollout([turn1, turn2])
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",)))
    prompts = _prompts(tok)
    out = loop.generate(rollout, prompts, _sampling())

    tool_ids = _ids(tok, loop.parser.format_responses(["5"]))
    expected = turn1 + tool_ids + turn2
    mask = [1] * len(turn1) + [0] * len(tool_ids) + [1] * len(turn2)
    R = 200
    for row in range(2):
        resp = out.batch["responses"][row]
        assert resp[: len(expected)].tolist() == expected
        assert out.batch["response_mask"][row, : len(expected)].tolist() == mask
        assert out.batch["response_mask"][row, len(expected) :].sum() == 0
        # The model saw the tool turn: attention covers it; padding after is unseen.
        att = out.batch["attention_mask"][row, prompts.batch["input_ids"].shape[1] :]
        assert att[: len(expected)].tolist() == [1] * len(expected)
        assert att[len(expected) :].sum() == 0
        # Rollout log-probs only on model tokens.
        lp = out.batch["rollout_log_probs"][row]
        assert torch.all(lp[: len(turn1)] < 0)
        assert torch.all(lp[len(turn1) : len(turn1) + len(tool_ids)] == 0)
    assert out.batch["responses"].shape == (2, R)
    assert out.batch["input_ids"].shape == (2, 24 + R)
    # The second model turn was asked with the whole conversation so far, ids untouched.
    second = [p for p in rollout.seen_prompts if len(p) > 30]
    assert second
    assert second[0][-len(turn1 + tool_ids) :] == turn1 + tool_ids
    agent = out.non_tensor_batch["agent"][0]
    assert agent["num_turns"] == 2
    assert agent["tool_calls"] == 1
    assert agent["tool_errors"] == 0
    assert [t["role"] for t in agent["turns"]] == ["assistant", "tool", "assistant"]
    assert agent["turns"][1]["content"] == "5"
    metrics = out.meta_info["metrics"]
    assert metrics["agent/turns"] == [2.0]
    assert metrics["agent/tool_calls"] == [1.0]
    assert metrics["agent/tool_use_rate"] == [1.0]
    assert metrics["agent/truncated"] == [0.0]


@pytest.mark.parametrize(
    ("tool", "needle"),
    [
        (BrokenTool(), "failed: RuntimeError: disk on fire"),
        (SleepingTool(), "did not answer within 0.2 s"),
        (DyingTool(), "ended its process without an answer (exit code 7)"),
        (NotTextTool(), "failed: returned int, not text"),
    ],
)
def test_a_tool_that_raises_or_hangs_answers_an_error_and_is_counted(tokenizer, tool, needle):
    tok = tokenizer
    rollout = ScriptedRollout([[*_ids(tok, CALL), 2], [*_ids(tok, "#### 5"), 2]])
    loop = AgentLoop(tok, [tool], AgentConfig(tools=("add",), tool_timeout_s=0.2))
    out = loop.generate(rollout, _prompts(tok, n=1), _sampling())
    agent = out.non_tensor_batch["agent"][0]
    assert agent["tool_calls"] == 1
    assert agent["tool_errors"] == 1
    assert needle in agent["turns"][1]["content"]
    assert agent["num_turns"] == 2  # the model got the error and answered
    assert out.meta_info["metrics"]["agent/tool_errors"] == [1.0]
    assert out.meta_info["metrics"]["agent/tool_use_rate"] == [0.0]
    timed_out = float(isinstance(tool, SleepingTool))
    assert out.meta_info["metrics"]["agent/tool_timeouts"] == [timed_out]


def test_unknown_tool_bad_arguments_and_bad_json_are_errors(tokenizer):
    tok = tokenizer
    text = (
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"b": 1}}</tool_call><tool_call>{x}</tool_call>'
    )
    turn = [*_ids(tok, text), 2]
    rollout = ScriptedRollout([turn, [*_ids(tok, "#### 1"), 2]])
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",)))
    agent = loop.generate(rollout, _prompts(tok, n=1), _sampling()).non_tensor_batch["agent"][0]
    assert agent["tool_calls"] == 3
    assert agent["tool_errors"] == 3
    texts = " | ".join(t["content"] for t in agent["turns"] if t["role"] == "tool")
    assert "not valid JSON" in texts
    assert "unknown tool 'nope'; available: add" in texts
    assert "add needs a and b" in texts


def test_over_the_token_budget_is_truncated_and_flagged(tokenizer):
    tok = tokenizer
    # Calls forever: the response budget (60 tokens, all turns) runs out.
    rollout = ScriptedRollout([[*_ids(tok, CALL), 2]])
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",), max_turns=50))
    out = loop.generate(rollout, _prompts(tok, n=1), _sampling(max_new=60))
    agent = out.non_tensor_batch["agent"][0]
    assert agent["truncated"] is True
    assert int(out.batch["attention_mask"][0, 24:].sum()) == 60  # filled exactly, no more
    assert out.meta_info["metrics"]["agent/truncated"] == [1.0]


def test_over_the_turn_budget_is_truncated_and_flagged(tokenizer):
    tok = tokenizer
    rollout = ScriptedRollout([[*_ids(tok, CALL), 2]])
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",), max_turns=3))
    agent = loop.generate(rollout, _prompts(tok, n=1), _sampling(max_new=1000)).non_tensor_batch[
        "agent"
    ][0]
    assert agent["num_turns"] == 3
    assert agent["tool_calls"] == 2  # the third turn's call is not run: no turn left
    assert agent["truncated"] is True


def test_a_generation_that_hangs_ends_its_conversation(tokenizer):
    tok = tokenizer
    rollout = ScriptedRollout([[*_ids(tok, "#### 1"), 2]], delay_s=5.0)
    loop = AgentLoop(tok, [], AgentConfig(generation_timeout_s=0.2))
    start = time.monotonic()
    out = loop.generate(rollout, _prompts(tok, n=2), _sampling())
    assert time.monotonic() - start < 3
    assert out.meta_info["metrics"]["agent/generation_timeouts"] == [2.0]
    assert out.meta_info["metrics"]["agent/truncated"] == [1.0]
    assert int(out.batch["response_mask"].sum()) == 0


def test_many_conversations_are_in_flight_at_once(tokenizer):
    tok = tokenizer
    rollout = ScriptedRollout([[*_ids(tok, CALL), 2], [*_ids(tok, "#### 5"), 2]], delay_s=0.05)
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",), max_parallel_conversations=16))
    out = loop.generate(rollout, _prompts(tok, n=32), _sampling())
    assert rollout.max_in_flight == 16  # the semaphore's bound, reached
    assert out.meta_info["metrics"]["agent/turns"] == [2.0]


class _SeesConversation(BaseReward):
    """Records what it is given; scores 1 when the last model turn is ``#### 5``."""

    seen: list[dict[str, Any]] = []  # noqa: RUF012 (a test probe)

    def score(self, data_source, solution_str, ground_truth, extra_info=None):
        self.seen.append(dict(extra_info or {}))
        turns = (extra_info or {}).get("turns") or []
        return float(bool(turns) and turns[-1]["content"] == "#### 5")


def test_rewards_see_the_turns_in_extra_info_and_score_the_last_model_token(tokenizer):
    import numpy as np

    from rlcore.reward import RewardManager

    tok = tokenizer
    turn1, turn2 = [*_ids(tok, CALL), 2], [*_ids(tok, "#### 5"), 2]
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",)))
    out = loop.generate(ScriptedRollout([turn1, turn2]), _prompts(tok, n=1), _sampling())
    out.non_tensor_batch["data_source"] = np.array(["toy"], dtype=object)
    out.non_tensor_batch["reward_model"] = np.array([{"ground_truth": "5"}], dtype=object)
    out.non_tensor_batch["extra_info"] = np.array([{"index": 7}], dtype=object)
    reward = _SeesConversation()
    scores, _ = RewardManager(tok, {"seen": reward}, default="seen", num_workers=1)(out)
    extra = reward.seen[-1]
    assert extra["index"] == 7  # the row's own extra_info is kept
    assert [t["role"] for t in extra["turns"]] == ["assistant", "tool", "assistant"]
    assert extra["tool_calls"] == 1
    assert extra["tool_errors"] == 0
    last = len(turn1) + len(_ids(tok, loop.parser.format_responses(["5"]))) + len(turn2) - 1
    assert scores.batch["token_level_scores"][0].nonzero().flatten().tolist() == [last]
    assert float(scores.batch["token_level_scores"][0, last]) == 1.0


class _HangingBatchRollout(BaseRollout):
    """Uses BaseRollout's default generate_one (a thread over generate), which hangs."""

    def __init__(self) -> None:
        super().__init__(RolloutSpec(model_path="-"))
        self.release = threading.Event()

    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        self.release.wait(60)  # bounded so that the thread ends after the test
        raise RuntimeError("released")

    def update_weights(self, named_tensors: Any) -> None:
        pass


def test_a_hung_generation_thread_does_not_hold_the_batch(tokenizer):
    rollout = _HangingBatchRollout()
    loop = AgentLoop(tokenizer, [], AgentConfig(generation_timeout_s=0.3))
    start = time.monotonic()
    out = loop.generate(rollout, _prompts(tokenizer, n=2), _sampling())
    assert time.monotonic() - start < 30  # the thread still hangs (60 s); we did not wait
    rollout.release.set()
    assert out.meta_info["metrics"]["agent/generation_timeouts"] == [2.0]


# --- hostile model output and hostile tools: errors for their own conversation only --------


class PerRowRollout(ScriptedRollout):
    """Replays ``scripts[i][k]`` as the k-th model turn of the conversation of prompt row i."""

    def __init__(self, rows: list[list[int]], scripts: list[list[list[int]]]) -> None:
        super().__init__([])
        self.rows, self.scripts = rows, scripts

    def script(self, prompt_ids: list[int]) -> list[list[int]]:
        return self.scripts[next(i for i, r in enumerate(self.rows) if prompt_ids[: len(r)] == r)]


def _rows(tok, n: int) -> list[list[int]]:
    return [
        _ids(tok, f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\n") for i in range(n)
    ]


def _call(tool: str) -> str:
    return f'<tool_call>{{"name": "{tool}", "arguments": {{"a": 2, "b": 3}}}}</tool_call>'


def test_hostile_turns_are_errors_for_their_conversation_and_the_batch_comes_back(tokenizer):
    tok = tokenizer
    answer = [*_ids(tok, "#### 5"), 2]
    brackets = [*_ids(tok, "<tool_call>" + "[" * 1500 + "</tool_call>"), 2]
    digits = '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 4400 + "}}</tool_call>"
    scripts = [
        [brackets, answer],
        [[*_ids(tok, digits), 2], answer],
        [[*_ids(tok, CALL), 2], answer],
    ]
    rollout = PerRowRollout(_rows(tok, 3), scripts)
    loop = AgentLoop(tok, [AddTool()], AgentConfig(tools=("add",)))
    out = loop.generate(rollout, _prompts(tok, n=3, pad_to=24), _sampling(max_new=6000))
    agents = list(out.non_tensor_batch["agent"])
    assert [a["num_turns"] for a in agents] == [2, 2, 2]  # each model saw its error, answered
    assert agents[0]["turns"][1]["content"] == "error: tool call nests deeper than 32 levels"
    assert agents[1]["turns"][1]["content"] == (
        "error: tool call holds a number of more than 100 digits"
    )
    assert agents[2]["turns"][1]["content"] == "5"  # the healthy conversation, intact
    assert [a["malformed_calls"] for a in agents] == [1, 1, 0]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/malformed_calls"] == [2.0]
    assert metrics["agent/tool_errors"] == [2 / 3]
    assert metrics["agent/tool_use_rate"] == [1 / 3]


def test_hostile_tools_are_contained_and_killed_and_the_batch_comes_back(tokenizer, tmp_path):
    tok = tokenizer
    pid_file = tmp_path / "stuck.pid"
    tools = [
        ExitingTool("exit"),
        InterruptingTool("interrupt"),
        StuckInCTool(pid_file, "stuck"),
        AddTool(),
    ]
    answer = [*_ids(tok, "#### 5"), 2]
    names = ["exit", "interrupt", "stuck", "add"]
    scripts = [[[*_ids(tok, _call(n)), 2], answer] for n in names]
    rollout = PerRowRollout(_rows(tok, 4), scripts)
    loop = AgentLoop(tok, tools, AgentConfig(tools=tuple(names), tool_timeout_s=1.0))
    out = loop.generate(rollout, _prompts(tok, n=4, pad_to=24), _sampling())
    agents = list(out.non_tensor_batch["agent"])
    assert [a["turns"][1]["content"] for a in agents] == [
        "error: tool 'exit' failed: SystemExit: 3",
        "error: tool 'interrupt' failed: KeyboardInterrupt: ",
        "error: tool 'stuck' did not answer within 1.0 s",
        "5",
    ]
    assert [a["num_turns"] for a in agents] == [2, 2, 2, 2]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/tool_errors"] == [3 / 4]
    assert metrics["agent/tool_timeouts"] == [1.0]
    # The stuck tool's process held the GIL in C; it was killed, not left running.
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_tool_that_does_not_pickle_is_refused_when_the_loop_is_built(tokenizer):
    from rlcore.errors import ConfigError

    tool = AddTool()
    tool.lock = threading.Lock()  # not picklable
    with pytest.raises(ConfigError, match=r"^tool 'add' \(_agent_tools:AddTool\) cannot be sent"):
        AgentLoop(tokenizer, [tool], AgentConfig(tools=("add",)))
