"""The ``math`` rule reward: last ``\\boxed{}`` (or Minerva ``Answer:``) against the reference.

Example::

    reward = MathReward(MathReward.Config())
    reward.score("math500", "... so $x = \\boxed{\\dfrac{1}{2}}$.", "\\frac12")
    # -> {"score": 1.0, "acc": True, "pred": "\\dfrac{1}{2}"}

Scoring never raises on model output and returns within about ``timeout_s`` (see
:mod:`rlcore_math.verify` for how the comparison is bounded). Building the reward (or
unpickling it in a pool worker) imports math-verify and sympy, ~0.5-2 s once per process, so
that no import ever runs under a deadline.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import attrs

from rlcore.interfaces import BaseReward, key, seconds
from rlcore_math.extract import extract_answer, remove_boxed
from rlcore_math.verify import check_equiv, warm_up

__all__ = ["MathReward"]

log = logging.getLogger(__name__)


class MathReward(BaseReward):
    """Rule reward for competition maths: 1 for an answer equal to the reference, else 0."""

    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        extract: Literal["boxed", "answer", "both"] = key(
            "boxed",
            'Where the answer is: the last \\boxed{}, a Minerva "The final answer is '
            'X" line, or both (the box, the line as fallback).',
            validator=attrs.validators.in_(("boxed", "answer", "both")),
        )
        score: float = key(1.0, "Score of a correct answer.")
        format_score: float = key(0.0, "Score of an answer that was found but is wrong.")
        timeout_s: float = key(
            2.0,
            "Wall-clock limit of the symbolic (math-verify) checks of one response, "
            "all references together (s).",
            validator=seconds(holder="setitimer or a thread's join"),
        )
        use_math_verify: bool = key(
            True, "Compare answers symbolically with math-verify, not only as normalised strings."
        )

    config: MathReward.Config

    def __init__(self, config: MathReward.Config | None = None) -> None:
        super().__init__(config)
        self._warm_up()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in a reward-pool worker: import there too before the first deadline.
        self.__dict__.update(state)
        self._warm_up()

    def _warm_up(self) -> None:
        """Import math-verify now, never under a per-sample deadline (see verify.py)."""
        if self.config.use_math_verify:
            warm_up()

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``{"score", "acc", "pred"}`` for one decoded response; ``pred`` is None if none found."""
        cfg = self.config
        pred = extract_answer(solution_str if isinstance(solution_str, str) else "", cfg.extract)
        if pred is None:
            return {"score": 0.0, "acc": False, "pred": None}
        acc = False
        # One budget for the whole call: several references share it, and once it is
        # spent the remaining ones get the cheap exact checks only.
        deadline = time.monotonic() + cfg.timeout_s
        for ref in _ground_truth_texts(ground_truth):
            remaining = deadline - time.monotonic()
            acc, reason = check_equiv(
                pred,
                remove_boxed(ref),
                use_math_verify=cfg.use_math_verify and remaining > 0.0,
                timeout_s=max(remaining, 1e-3),
            )
            if reason in ("timeout", "unsafe", "error"):
                log.debug("math reward for %s: %s answer judged wrong", data_source, reason)
            if acc:
                break
        return {"score": cfg.score if acc else cfg.format_score, "acc": acc, "pred": pred}


def _ground_truth_texts(ground_truth: Any) -> list[str]:
    """References are strings, but AMC's are floats (27.0) and a list holds alternatives."""
    items = list(ground_truth) if isinstance(ground_truth, list | tuple) else [ground_truth]
    texts = []
    for item in items[:8]:
        if isinstance(item, float) and item.is_integer():
            texts.append(str(int(item)))
        else:
            texts.append(str(item))
    return texts
