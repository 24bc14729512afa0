"""A GSM8K-style environment where the model may call the calculator.

Two parts: the prompt (:func:`system_prompt` describes the tool and the call format, and
:func:`make_row` builds a verl-schema row with it) and the reward, :class:`GSM8KToolReward`,
which reads the whole conversation from ``extra_info`` (the agent loop's ``turns``): the
answer must be the final assistant turn's ``#### <number>`` (GSM8K's strict rule), and an
optional ``tool_bonus`` is added when the conversation made at least one successful call.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from rlcore.interfaces import BaseReward, key
from rlcore_calculator.tool import CalculatorTool
from rlcore_gsm8k.reward import compute_score

__all__ = ["GSM8KToolReward", "make_row", "system_prompt"]

SHORT_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>'


def system_prompt(style: str = "full") -> str:
    """The tool's description. ``"full"``: Qwen2.5's tool prompt; ``"short"``: one line
    (for tiny models with short contexts)."""
    if style == "short":
        return f"Tool: {SHORT_CALL}"
    schema = json.dumps({"type": "function", "function": CalculatorTool().schema()})
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schema}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
        'Give the final answer as "#### <number>".'
    )


def make_row(
    question: str, answer: str, *, index: int, split: str, style: str = "full"
) -> dict[str, Any]:
    """One row in verl's schema, with the tool's system prompt."""
    return {
        "data_source": "gsm8k_tool",
        "prompt": [
            {"role": "system", "content": system_prompt(style)},
            {"role": "user", "content": question},
        ],
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index},
    }


class GSM8KToolReward(BaseReward):
    """GSM8K's strict answer in the final model turn, plus ``tool_bonus`` for tool use."""

    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        """Options of ``[reward.options.gsm8k_tool]``."""

        tool_bonus: float = key(
            0.0,
            "Added to the score when the conversation made at least one successful tool call.",
            validator=attrs.validators.ge(0.0),
        )
        format_score: float = key(0.0, "Score of a final answer that was found but is wrong.")

    def __init__(self, config: GSM8KToolReward.Config | None = None) -> None:
        super().__init__(config)
        self.config: GSM8KToolReward.Config

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        extra = extra_info or {}
        turns = extra.get("turns")
        final = solution_str
        if isinstance(turns, list) and turns:
            answers = [t for t in turns if isinstance(t, dict) and t.get("role") == "assistant"]
            if answers:
                final = str(answers[-1].get("content", ""))
        correct = compute_score(final, ground_truth, format_score=self.config.format_score)
        calls = int(extra.get("tool_calls", 0) or 0)
        used = calls > int(extra.get("tool_errors", 0) or 0)
        bonus = self.config.tool_bonus if used else 0.0
        return {"score": correct + bonus, "acc": correct >= 1.0, "used_tool": used}
