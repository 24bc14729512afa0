"""The environment contract: ``reset``/``step`` with observation, reward, done.

An environment plugin registers classes through ``register_environments``; ``[agent]
environment = "NAME"`` gives every sample an instance of its own. The method names and
return shapes are gymnasium's (``reset`` -> ``(observation, info)``, ``step`` ->
``(observation, reward, terminated, truncated, info)``) so a gymnasium user reads them at
once, but the core does not depend on gymnasium: its spaces are numeric arrays, while an
LLM's observations and actions are text, and ``reset`` here takes the data set's row.

Harnesses reach it through :class:`~rlcore.interfaces.HarnessTask` (in-process harnesses get
``environment`` on their task, see :mod:`rlcore.agent.harness`); the built-in agent loop
calls ``step`` with each model turn's text. The reward summed over steps reaches the reward
function as ``extra_info["env_reward"]``. A ``step`` that raises ends only its sample
(``agent/env_errors``), with one log line naming the environment.
"""

from __future__ import annotations

import abc
from typing import Any

import attrs

__all__ = ["BaseEnvironment"]


class BaseEnvironment(abc.ABC):
    """One episode per sample: :meth:`reset` with the task, then :meth:`step` per action."""

    @attrs.frozen(kw_only=True)
    class Config:
        """The environment's own options (``[agent.options.NAME]``)."""

    def __init__(self, config: BaseEnvironment.Config | None = None) -> None:
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def reset(self, task: Any) -> tuple[str, dict[str, Any]]:
        """Start an episode for ``task`` (a :class:`~rlcore.interfaces.HarnessTask`):
        ``(observation, info)``; the observation may be empty."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's ``action`` text: ``(observation, reward, terminated, truncated,
        info)``."""
