"""GSM8K scoring with verl's semantics (``verl/utils/reward_score/gsm8k.py``), so that
scores compare with verl runs.

- Only the last 300 characters of a response are searched (verl's ``_SOLUTION_CLIP_CHARS``):
  the answer is expected at the end, and it bounds the regex work on long or adversarial text.
- ``strict``: the last ``#### <number>`` (``#### (-?[0-9.,]+)``); ``flexible``: the last
  number-like token. Commas (and ``$``) are removed from the prediction and the ground truth.
- Answers are compared as strings after that normalisation, as verl does: ``"18.0"`` does not
  equal ``"18"``, and a trailing period (``#### 18.``) makes the answer wrong. GSM8K ground
  truths are integers written without a period, so this only judges the model's formatting.
- ``score`` when the answer equals the ground truth, ``format_score`` when an answer was
  extracted but differs, 0 when none was extracted.

Two deliberate differences from verl, both only more lenient, documented so that a
comparison can account for them:

- strict accepts a ``$`` right after ``#### `` (``#### $18``); verl's regex cannot match
  it, although verl's code then strips ``$`` as if it could.
- flexible strips commas too (verl strips them in strict only) and skips tokens without a
  digit (verl skips only ``""`` and ``"."``, so it can pick ``","``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import attrs

from rlcore.interfaces import BaseReward, key

__all__ = ["GSM8KReward", "compute_score", "extract_solution", "normalize_answer"]

CLIP_CHARS = 300
_STRICT = re.compile(r"#### \$?(\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"\-?[0-9\.\,]+")
_DIGIT = re.compile(r"[0-9]")

Method = Literal["strict", "flexible"]


def normalize_answer(text: str) -> str:
    """Drop commas, ``$`` and surrounding whitespace: ``" $1,000 "`` -> ``"1000"``."""
    return text.replace(",", "").replace("$", "").strip()


def extract_solution(solution_str: str, method: Method = "strict") -> str | None:
    """The model's final answer, normalised, or ``None`` when there is none.

    >>> extract_solution("so 3 + 4 = 7\\n#### 7")
    '7'
    >>> extract_solution("The answer is 1,234.", method="flexible")
    '1234.'
    """
    if method not in ("strict", "flexible"):
        msg = f"gsm8k method must be 'strict' or 'flexible', got {method!r}"
        raise ValueError(msg)
    # Clip first: regex work stays O(300) whatever the model wrote.
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return normalize_answer(found[-1]) if found else None
    for token in reversed(_NUMBER.findall(tail)):
        if _DIGIT.search(token):
            return normalize_answer(token)
    return None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """verl's ``compute_score``: ``score`` if correct, ``format_score`` if wrong, else 0."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == normalize_answer(str(ground_truth)) else format_score


class GSM8KReward(BaseReward):
    """GSM8K rule reward. ``score`` returns ``{"score", "acc", "pred"}``.

    Example::

        reward = GSM8KReward(GSM8KReward.Config(method="flexible"))
        reward.score("openai/gsm8k", "... so she makes $18.", "18")
        # -> {"score": 1.0, "acc": True, "pred": "18"}
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        """``[reward.options.gsm8k]``."""

        method: Method = key(
            "strict",
            'strict: the answer is the last "#### <number>"; flexible: the last '
            "number in the response.",
            validator=attrs.validators.in_(("strict", "flexible")),
        )
        score: float = key(1.0, "Score of a correct answer.")
        format_score: float = key(
            0.0, "Score of an answer that was found but is wrong (no answer: 0)."
        )  # an answer was found, but it is wrong

    config: GSM8KReward.Config

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        cfg = self.config
        pred = extract_solution(solution_str, cfg.method)
        acc = pred is not None and pred == normalize_answer(str(ground_truth))
        if pred is None:
            value = 0.0
        else:
            value = cfg.score if acc else cfg.format_score
        return {"score": float(value), "acc": acc, "pred": pred}
