"""The calculator: arithmetic by AST walk, limits, conformance (with negative tests)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from rlcore.agent import BaseTool, ToolError
from rlcore.testing.conformance import check_plugin_module, check_tool
from rlcore_calculator.evaluate import CalculatorError, evaluate, format_number
from rlcore_calculator.tool import CalculatorTool


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12 * (3 + 4)", "84"),
        ("7 / 2", "3.5"),
        ("1/3", "0.3333333333"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),
        ("-5 + +3", "-2"),
        ("17 // 5 + 17 % 5", "5"),
        ("1,000 * 3", "3000"),
        ("6 × 7 ÷ 2", "21"),
        ("0.1 + 0.2", "0.3"),
    ],
)
def test_evaluates_arithmetic(text, value):
    assert format_number(evaluate(text)) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("__import__('os').system('true')", "unsupported syntax"),
        ("x + 1", "unsupported syntax: Name"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("[1]", "unsupported syntax: List"),
        ("(lambda: 1)()", "unsupported syntax"),
        ("1 / 0", "division by zero"),
        ("9 ** 9 ** 9", "exponent"),
        ("10.0 ** 64 * 10.0 ** 64", "larger than"),
        ("9" * 300, "longer than 200"),
        ("+".join(["1"] * 90), "more than 100 parts"),
        ("", "empty"),
        ("1 +", "not an arithmetic expression"),
        ("(-8) ** 0.5", "not a real number"),
    ],
)
def test_refuses_what_is_not_bounded_arithmetic(text, message):
    start = time.monotonic()
    with pytest.raises(CalculatorError, match=message):
        evaluate(text)
    assert time.monotonic() - start < 5.0  # refused before any big work (9 ** 9 ** 9 never ends)


def test_the_tool_answers_text_or_a_tool_error():
    tool = CalculatorTool()
    assert tool.name == "calculator"
    assert tool.call({"expression": "2 + 3"}) == "5"
    with pytest.raises(ToolError, match="expression"):
        tool.call({"expr": "2 + 3"})
    with pytest.raises(ToolError, match="division by zero"):
        tool.call({"expression": "1/0"})


def test_calculator_conformance():
    check_tool(CalculatorTool, cases=[({"expression": "6 * 7"}, "42")])


def test_plugin_module_is_light_and_registers_the_tool_and_reward():
    found = check_plugin_module("rlcore_calculator.plugin", resolve=True)
    assert found == {
        "tool/calculator": "rlcore_calculator.tool:CalculatorTool",
        "reward/gsm8k_tool": "rlcore_calculator.environment:GSM8KToolReward",
        "harness/openai_calculator": "rlcore_calculator.harness:OpenAICalculatorHarness",
    }


# --- check_tool negative tests: each broken tool is refused with the rule it breaks -------


class _Good(BaseTool):
    def schema(self) -> dict[str, Any]:
        return {"name": "good", "description": "d", "parameters": {"type": "object"}}

    def call(self, arguments: Mapping[str, Any]) -> str:
        return "ok"


class _NoName(_Good):
    def schema(self) -> dict[str, Any]:
        return {"description": "d", "parameters": {"type": "object"}}


class _BadParameters(_Good):
    def schema(self) -> dict[str, Any]:
        return {"name": "x", "description": "d", "parameters": ["expression"]}


class _ReturnsNumber(_Good):
    def call(self, arguments: Mapping[str, Any]) -> Any:
        return 42


class _RaisesKeyError(_Good):
    def call(self, arguments: Mapping[str, Any]) -> str:
        return str(arguments["expression"])


class _Slow(_Good):
    def call(self, arguments: Mapping[str, Any]) -> str:
        time.sleep(0.3)
        return "ok"


class _WrongAnswer(_Good):
    pass


class _UndecoratedConfig(_Good):
    class Config(BaseTool.Config):
        limit: int = 3


class _Unpicklable(_Good):
    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.lock = __import__("threading").Lock()


@pytest.mark.parametrize(
    ("cls", "rule", "kwargs"),
    [
        (_NoName, r"schema\(\) must return.*name is None", {}),
        (_BadParameters, r"schema\(\) must return.*parameters is", {}),
        (_ReturnsNumber, "call must return a str", {}),
        (_RaisesKeyError, "raise rlcore.agent.ToolError", {}),
        (_Slow, "within time_limit_s", {"time_limit_s": 0.1}),
        (_WrongAnswer, "expected text", {"cases": [({"expression": "1+1"}, "2")]}),
        (_UndecoratedConfig, "must be decorated", {}),
        (_Unpicklable, "must pickle", {}),
    ],
)
def test_check_tool_refuses_broken_tools(cls, rule, kwargs):
    with pytest.raises(AssertionError, match=rule):
        check_tool(cls, **kwargs)


def test_check_tool_refuses_a_non_tool():
    with pytest.raises(AssertionError, match="must subclass"):
        check_tool(int)  # type: ignore[arg-type]


def test_check_tool_passes_a_good_tool():
    check_tool(_Good, cases=[({}, "ok")])
    assert attrs.has(_Good.Config)


def test_calls_run_in_a_process_of_their_own_from_a_ray_worker(ray_session):
    """Where the agent loop runs: a Ray worker, whose ``__main__`` is Ray's own script (kept out
    of the tool's process) and which holds Ray's threads (hence forkserver, not fork)."""
    import ray

    from rlcore.agent.tool_processes import ToolOutcome

    @ray.remote(num_cpus=0)
    def call() -> tuple[ToolOutcome, ToolOutcome]:
        from rlcore.agent.tool_processes import ToolProcesses

        tools = ToolProcesses({"calculator": CalculatorTool()})
        ok = tools.call("calculator", {"expression": "12 * (3 + 4)"}, timeout_s=30, max_chars=100)
        bad = tools.call(
            "calculator", {"expression": "__import__('os')"}, timeout_s=30, max_chars=9
        )
        return ok, bad

    ok, bad = ray.get(call.remote(), timeout=300)
    assert ok == ToolOutcome("84", "ok")
    assert bad.kind == "tool_error"
