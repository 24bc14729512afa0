"""The harness contract: agent code rlcore trains as a black box behind an OpenAI endpoint.

A harness plugin registers classes through ``register_harnesses`` and ``[agent] harness =
"NAME"`` selects one. For each sample rlcore opens a session on the rollout replica's
OpenAI-compatible endpoint (:mod:`rlcore.agent.endpoint`) and calls
:meth:`BaseHarness.run` with the task row, a ``base_url`` and an API key; the harness runs
any agent code (the ``openai`` client, a coding agent, a subprocess of its own) and returns
the final answer and reward inputs. rlcore assembles the trained sample from the calls the
endpoint recorded (:mod:`rlcore.agent.trajectory`), never from the text the harness returns.

``[agent] harness_isolation = "process"`` (the default) runs ``run`` in a child process with
``harness_timeout_s`` and ``harness_memory_mb`` bounds; the harness class must then be
importable by name in a fresh interpreter (a plugin, or a module on ``PYTHONPATH``) and its
task and result travel as JSON. ``"thread"`` runs it in the worker (faster start; a hung
harness is abandoned at the timeout, its session closed, so it costs only its sample).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["BaseHarness", "HarnessResult", "HarnessTask"]


@attrs.frozen(kw_only=True)
class HarnessTask:
    """One row of the data set, as a harness sees it (JSON-able)."""

    messages: list[dict[str, Any]]  # the row's prompt (verl's ``prompt`` column)
    ground_truth: Any = None
    data_source: str = ""
    extra_info: dict[str, Any] = attrs.Factory(dict)
    index: int = 0  # the row's place in its batch
    # [agent] environment: this sample's own instance (never serialised; a child process
    # builds its own).
    environment: Any = attrs.field(default=None, eq=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self, filter=lambda a, _v: a.name != "environment")

    def with_environment(self, environment: Any) -> HarnessTask:
        return attrs.evolve(self, environment=environment)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HarnessTask:
        return cls(**{f.name: data[f.name] for f in attrs.fields(cls) if f.name in data})


@attrs.frozen(kw_only=True)
class HarnessResult:
    """What a harness hands back. ``answer``: its final answer (rewards that read the
    conversation see it as the last assistant turn); ``reward_inputs``: merged into the row's
    ``extra_info`` for the reward function (e.g. ``{"env_reward": 1.0}``)."""

    answer: str | None = None
    reward_inputs: dict[str, Any] = attrs.Factory(dict)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def coerce(cls, value: Any) -> HarnessResult | None:
        """A result from what ``run`` returned (a result, a dict of its fields, or the answer
        as a string); None when it returned nothing usable."""
        if isinstance(value, HarnessResult):
            return value
        if isinstance(value, str):
            return cls(answer=value)
        if isinstance(value, Mapping) and ("answer" in value or "reward_inputs" in value):
            answer = value.get("answer")
            inputs = value.get("reward_inputs") or {}
            if (answer is None or isinstance(answer, str)) and isinstance(inputs, Mapping):
                return cls(answer=answer, reward_inputs=dict(inputs))
        return None


class BaseHarness(abc.ABC):
    """Runs an agent on one task against an OpenAI-compatible ``base_url``.

    Example::

        class MyHarness(BaseHarness):
            def run(self, task, base_url, api_key):
                client = openai.OpenAI(base_url=base_url, api_key=api_key)
                out = client.chat.completions.create(model="policy", messages=task.messages)
                return HarnessResult(answer=out.choices[0].message.content)
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The harness's own options (``[agent.options.NAME]``)."""

    def __init__(self, config: BaseHarness.Config | None = None) -> None:
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def run(self, task: HarnessTask, base_url: str, api_key: str) -> HarnessResult | str | None:
        """Drive the agent; return its final answer (a :class:`HarnessResult` or a string)."""
