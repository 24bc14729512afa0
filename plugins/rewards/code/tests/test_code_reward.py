"""The code reward on real HumanEval: every canonical solution passes, broken ones fail with
the reason counted; code extraction; the plugin and reward contracts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlcore.testing.conformance import check_plugin_module, check_reward
from rlcore_code.extract import code_blocks, extract_code, with_prefix
from rlcore_code.reward import REASONS, CodeReward
from rlcore_code.sandbox import SandboxOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _humaneval

ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


@pytest.fixture(scope="module")
def reward():
    return CodeReward()


@pytest.fixture(scope="module")
def roomy():
    # Correctness, not speed: room for a machine under load (the default wall clock is 3 s).
    return CodeReward(CodeReward.Config(sandbox=SandboxOptions(timeout_s=30.0, cpu_s=20)))


@pytest.fixture(scope="module")
def rows():
    return _humaneval.rows()


def score(reward, response, row):
    return reward.score(
        row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"]
    )


def test_plugin_module_registers_the_reward_and_the_tool():
    assert check_plugin_module("rlcore_code.plugin", resolve=True) == {
        "reward/code": "rlcore_code.reward:CodeReward",
        "tool/code_interpreter": "rlcore_code.tool:CodeInterpreterTool",
    }


def test_reward_conformance():
    cases = [
        ("```python\ndef add(a, b):\n    return a + b\n```", ADD_TESTS, 1.0),
        ("def add(a, b):\n    return a - b", ADD_TESTS, 0.0),
        ("no code at all, only words", ADD_TESTS, 0.0),
    ]
    check_reward(CodeReward, cases=cases)


def test_all_164_canonical_solutions_score_1(roomy, rows):
    assert len(rows) == 164
    results = {row["extra_info"]["task_id"]: score(roomy, _humaneval.canonical_response(row), row)
               for row in rows}  # fmt: skip
    failed = {task: r for task, r in results.items() if r["score"] != 1.0}
    assert not failed
    assert {r["reason"] for r in results.values()} == {"pass"}


def test_completion_style_bodies_continue_the_prompt(roomy, rows):
    # A base model's completion is the body only; the row's code_prefix (the prompt) goes first.
    for row in rows[:8]:
        result = score(roomy, row["extra_info"]["canonical_solution"], row)
        assert result["reason"] == "pass", row["extra_info"]["task_id"]


def _variant(row, body: str) -> str:
    return f"```python\n{row['extra_info']['code_prefix']}{body}\n```"


def test_broken_variants_score_0_with_their_reason(reward, rows):
    by_id = {row["extra_info"]["task_id"]: row for row in rows}
    strlen = by_id["HumanEval/23"]  # def strlen(string: str) -> int: return len(string)
    truncate = by_id["HumanEval/2"]  # def truncate_number(number: float) -> float
    assert strlen["extra_info"]["canonical_solution"].strip() == "return len(string)"
    cases = [
        (truncate, "    return number", "fail"),  # wrong return value
        (strlen, "    return len(string) + 1", "fail"),  # off by one
        (strlen, "    return len(string[1:]) if string else 0", "fail"),  # off by one, subtler
        (strlen, "    raise ValueError('no')", "error"),  # an exception
        (strlen, "    while True:\n        pass", "timeout"),  # an infinite loop
        (strlen, "    return len(string", "syntax"),
        (strlen, "    import sys; sys.exit(0)", "exit"),  # exit 0 before the tests: no pass
        (strlen, "    print('all tests passed'); import os; os._exit(0)", "crash"),
    ]
    for row, body, reason in cases:
        result = score(reward, _variant(row, body), row)
        assert (result["score"], result["reason"]) == (0.0, reason), body
        assert result["acc"] is False


def test_reasons_are_the_documented_ones(reward):
    got = reward.score("t", "", ADD_TESTS)
    assert got == {"score": 0.0, "acc": False, "reason": "no_code", "error": ""}
    assert reward.score("t", "def add(a, b): return a + b", "  \n")["reason"] == "bad_test"
    assert set(REASONS) >= {"pass", "fail", "timeout", "memory", "output_limit", "syntax"}


# --- extraction -----------------------------------------------------------------------------


def test_extract_code_prefers_the_last_python_block():
    text = (
        "Plan:\n```text\nsteps\n```\n```python\nx = 1\n```\nand\n~~~py\nx = 2\n~~~\n"
        "```bash\nls\n```\n"
    )
    assert extract_code(text) == "x = 2"
    assert extract_code(text, "first") == "x = 1"
    assert extract_code(text, "all") == "x = 1\n\nx = 2"
    # Without a language tag, untagged blocks count; other languages never do.
    assert extract_code("```\ny = 3\n```") == "y = 3"
    assert extract_code("```bash\nls\n```") is None
    # No fence: the whole response; cut off inside a block: up to the end.
    assert extract_code("def f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("```python\ndef f():\n    return") == "def f():\n    return"
    assert extract_code("   \n") is None


def test_fences_need_at_least_as_many_closing_characters():
    assert code_blocks("````python\n```\nstill code\n````") == [("python", "```\nstill code")]


def test_prefix_goes_before_the_code():
    assert with_prefix("    return 1", "def f():\n") == "def f():\n    return 1"
    assert with_prefix("x = 1", None) == "x = 1"
