"""``openai_calculator``: a multi-turn agent written only against the ``openai`` client.

The agent any user could have written before rlcore existed: it sends the task's messages and
the calculator's function schema to ``/v1/chat/completions``, runs each requested call itself
(the calculator's arithmetic, no ``eval``), appends the assistant message as it came back and
one ``tool`` message per call, and asks again, up to ``max_turns`` model turns; the last
assistant text is its answer. rlcore trains it through the endpoint (``[agent] harness =
"openai_calculator"``, see examples/quickstart/agent_openai.toml): it never sees a token id.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from rlcore.interfaces import BaseHarness, HarnessResult, HarnessTask, key
from rlcore_calculator.tool import CalculatorTool

__all__ = ["OpenAICalculatorHarness"]


class OpenAICalculatorHarness(BaseHarness):
    """Chat with function calling to the calculator; see the module docstring."""

    @attrs.frozen(kw_only=True)
    class Config(BaseHarness.Config):
        """Options of ``[agent.options.openai_calculator]``."""

        max_turns: int = key(2, "Model turns per task.", validator=attrs.validators.ge(1))
        model: str = key("policy", "The model name sent (the endpoint serves one policy).")

    def __init__(self, config: OpenAICalculatorHarness.Config | None = None) -> None:
        super().__init__(config)
        self.config: OpenAICalculatorHarness.Config

    def run(self, task: HarnessTask, base_url: str, api_key: str) -> HarnessResult:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        calculator = CalculatorTool()
        tools = [{"type": "function", "function": calculator.schema()}]
        messages: list[dict[str, Any]] = [dict(m) for m in task.messages]
        answer, calls, errors = "", 0, 0
        for turn in range(self.config.max_turns):
            out = client.chat.completions.create(
                model=self.config.model,
                messages=messages,
                tools=tools,  # type: ignore[arg-type]
            )
            message = out.choices[0].message
            answer = message.content or ""
            messages.append({"role": "assistant", "content": answer})
            if not message.tool_calls or turn + 1 == self.config.max_turns:
                break
            for call in message.tool_calls:
                calls += 1
                try:
                    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
                    result = calculator.call(arguments)
                except Exception as err:  # the model's bad call: shown to it, as any agent does
                    errors += 1
                    result = f"error: {err}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return HarnessResult(
            answer=answer, reward_inputs={"tool_calls": calls, "tool_errors": errors}
        )
