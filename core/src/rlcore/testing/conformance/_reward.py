"""``check_reward``: a rule reward is pure, total, bounded in time and picklable."""

from __future__ import annotations

import importlib
import math
import pickle
import time
from collections.abc import Iterable
from typing import Any

from rlcore.interfaces import BaseReward
from rlcore.testing.conformance._common import check_time_limit, fail, is_number
from rlcore.testing.conformance._contract import check_class, construct

__all__ = ["ADVERSARIAL_INPUTS", "check_reward"]

# (label, solution_str, ground_truth): what a policy (or a corrupt row) can hand a reward.
ADVERSARIAL_INPUTS: tuple[tuple[str, str, str], ...] = (
    ("empty response", "", "42"),
    ("empty ground truth", "#### 42 \\boxed{42}", ""),
    ("100 kB of digits", "1" * 100_000, "42"),
    ("100 kB of digits after ####", "#### " + "9" * 100_000, "42"),
    ("deeply nested braces", "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}", "1"),
    ("unbalanced \\boxed{", "the answer is \\boxed{42" + "{" * 1_000, "42"),
    ("many \\boxed{", "\\boxed{" * 2_000, "42"),
    ("huge power", "\\boxed{9^{9^{9^{9^{9}}}}}", "1"),
    ("huge factorial", "\\boxed{100000!}", "1"),
    ("non-ASCII", "答案是 \\boxed{½} — ∑ 🙂 #### ٤٢", "½"),
    ("control characters", "\x00\x1b[31m#### 4\x002\r\n\\boxed{\x00}", "42"),
    ("whitespace only", " \n\t " * 1_000, "0"),
    ("non-ASCII ground truth", "\\boxed{x}", "\\frac{√2}{２}"),
)


def _score(reward: BaseReward, data_source: str, solution: str, truth: str) -> Any:
    return reward.score(data_source, solution, truth, {"index": 0, "split": "conformance"})


def _value(result: Any, what: str, label: str) -> float:
    """The float score of a result, or a failure naming the contract rule."""
    rule = "score must return a finite float or a dict with a finite float 'score'"
    if isinstance(result, dict):
        if "score" not in result:
            fail(what, rule, f"{label}: dict without 'score' key: {sorted(result)}")
        value = result["score"]
    else:
        value = result
    if not is_number(value):
        fail(what, rule, f"{label}: got {value!r}")
    return float(value)


def _same(a: Any, b: Any) -> bool:
    # repr: NaN-safe and strict about types (1 vs True vs 1.0) for dict extras.
    return type(a) is type(b) and repr(a) == repr(b)


def _rescore(
    what: str,
    reward: BaseReward,
    data_source: str,
    inputs: list[tuple[str, str, str]],
    first: dict[str, Any],
    rule: str,
    sep: str,
) -> None:
    """Score ``inputs`` again with ``reward``: each result must be the same as ``first``'s."""
    for label, solution, truth in inputs:
        got = _score(reward, data_source, solution, truth)
        if not _same(got, first[label]):
            fail(what, rule, f"{label}: {first[label]!r} {sep} {got!r}")


def check_reward(
    cls: type[BaseReward],
    config: BaseReward.Config | None = None,
    cases: Iterable[tuple[str, str, float]] = (),
    *,
    data_source: str = "conformance",
    time_limit_s: float = 10.0,
) -> None:
    """Check a reward class against the :class:`~rlcore.interfaces.BaseReward` contract.

    ``cases`` are ``(solution_str, ground_truth, expected_score)`` the author knows; each must
    score ``expected_score`` (``math.isclose``). Every call to ``score`` (the cases and
    :data:`ADVERSARIAL_INPUTS`) must return within ``time_limit_s`` of wall-clock time; a call
    that never returns hangs the check, so run it under ``pytest-timeout``.
    """
    what, config = check_class(cls, BaseReward, config, "reward.options")
    reward = construct(what, cls, config, "reward")

    inputs = [(label, s, g) for label, s, g in ADVERSARIAL_INPUTS]
    inputs += [(f"case {i} {s[:40]!r}", s, g) for i, (s, g, _) in enumerate(cases)]
    first: dict[str, Any] = {}
    for label, solution, truth in inputs:
        start = time.monotonic()
        try:
            result = _score(reward, data_source, solution, truth)
        except Exception as err:  # the finding: model output made the reward raise
            fail(
                what,
                "score must never raise on model output",
                f"{label}: {type(err).__name__}: {err}",
            )
        check_time_limit(what, "score", label, start, time_limit_s)
        _value(result, what, label)
        first[label] = result

    for i, (solution, truth, expected) in enumerate(cases):
        got = _value(first[f"case {i} {solution[:40]!r}"], what, f"case {i}")
        if not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
            fail(
                what,
                "author case scored wrong",
                f"case {i} ({solution[:60]!r} vs {truth!r}): expected {expected}, got {got}",
            )

    # Deterministic: the same input gives the same result (also after other calls).
    again = inputs[:4] + inputs[len(ADVERSARIAL_INPUTS) :]
    _rescore(what, reward, data_source, again, first, "score must be deterministic", "then")

    # The reward manager's process pool pickles rewards and imports their class by path.
    try:
        found: Any = importlib.import_module(cls.__module__)
    except ImportError:
        found = None
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not cls:
        fail(
            what,
            "the class must be importable by module path (the scoring pool unpickles it in "
            "another process); define it at module level",
            f"{cls.__module__}:{cls.__qualname__} does not resolve to it",
        )
    try:
        copy = pickle.loads(pickle.dumps(reward))
    except Exception as err:  # any pickling failure is the finding
        fail(what, "the reward must pickle (scoring pool)", f"{type(err).__name__}: {err}")
    again = inputs[:2] + inputs[len(ADVERSARIAL_INPUTS) :]
    rule = "an unpickled reward must score like the original"
    _rescore(what, copy, data_source, again, first, rule, "vs")
