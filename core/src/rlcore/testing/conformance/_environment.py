"""``check_environment``: an environment starts an episode per task and steps on any text."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rlcore.interfaces import BaseEnvironment, HarnessTask
from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_class, construct

__all__ = ["ADVERSARIAL_ACTIONS", "check_environment"]

# What a policy's turn can be: the model writes any text, and an environment that raises on
# it costs its sample (rlcore.agent.harness.EnvironmentStepError), every time it is sampled.
ADVERSARIAL_ACTIONS: tuple[tuple[str, str], ...] = (
    ("empty", ""),
    ("100 kB", "9" * 100_000),
    ("non-ASCII", "½ + ٤٢ 🙂 答案"),
    ("control characters", "\x00\x1b[31m1+1"),
    ("a tool call", '<tool_call>{"name": "x", "arguments": {}}</tool_call>'),
    ("python code", "__import__('os').system('true')"),
)

_TASK = HarnessTask(
    messages=[{"role": "user", "content": "What is 2 + 3?"}],
    ground_truth="5",
    data_source="conformance",
)


def _check_reset(what: str, out: Any) -> None:
    if not (isinstance(out, tuple) and len(out) == 2):
        fail(what, "reset must return (observation, info)", f"got {type(out).__name__}")
    observation, info = out
    if not isinstance(observation, str) or not isinstance(info, dict):
        shown = f"({type(observation).__name__}, {type(info).__name__})"
        fail(what, "reset must return (str, dict)", f"got {shown}")


def _check_step(what: str, label: str, out: Any) -> float:
    if not (isinstance(out, tuple) and len(out) == 5):
        fail(what, "step must return (observation, reward, terminated, truncated, info)", label)
    observation, reward, terminated, truncated, info = out
    if not isinstance(observation, str) or not isinstance(info, dict):
        fail(what, "step's observation must be a str and its info a dict", label)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        fail(what, "step's reward must be a finite number", f"{label}: {reward!r}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        fail(what, "step's terminated and truncated must be bools", label)
    return float(reward)


def check_environment(
    cls: type[BaseEnvironment],
    config: BaseEnvironment.Config | None = None,
    cases: Iterable[tuple[HarnessTask, Sequence[str], float]] = (),
    *,
    time_limit_s: float = 5.0,
) -> None:
    """Check an environment class against the :class:`~rlcore.interfaces.BaseEnvironment`
    contract.

    Rules: the ``Config`` rules; ``reset(task)`` returns ``(str, dict)``; ``step(action)``
    returns ``(str, finite number, bool, bool, dict)`` and does not raise on any of
    :data:`ADVERSARIAL_ACTIONS` (each the first action of a fresh episode), each call within
    ``time_limit_s``; a second ``reset`` starts a new episode. ``cases`` are ``(task,
    actions, expected total reward)`` the author knows: the actions are stepped in order
    until the episode ends, and the rewards summed.
    """
    what, config = check_class(cls, BaseEnvironment, config, "agent.options")
    env = construct(what, cls, config, "environment")

    def timed(label: str, call: Any, *args: Any) -> Any:
        start = time.monotonic()
        try:
            out = call(*args)
        except Exception as err:  # the finding: model text or a task made it raise
            fail(what, f"{call.__name__} must not raise", f"{label}: {type(err).__name__}: {err}")
        if time.monotonic() - start > time_limit_s:
            fail(what, f"{call.__name__} must return within time_limit_s={time_limit_s:g}", label)
        return out

    for label, action in ADVERSARIAL_ACTIONS:
        _check_reset(what, timed(f"reset before {label}", env.reset, _TASK))
        _check_step(what, label, timed(label, env.step, action))
    for i, (task, actions, expected) in enumerate(cases):
        _check_reset(what, timed(f"case {i} reset", env.reset, task))
        total = 0.0
        for j, action in enumerate(actions):
            out = timed(f"case {i} action {j}", env.step, action)
            total += _check_step(what, f"case {i} action {j}", out)
            if out[2] or out[3]:
                break
        if not math.isclose(total, expected, rel_tol=1e-9, abs_tol=1e-9):
            fail(
                what, "the author's case must score as expected", f"case {i}: {total} != {expected}"
            )
