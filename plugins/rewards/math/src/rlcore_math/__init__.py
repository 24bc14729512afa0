"""rlcore-math: a rule reward for competition maths (MATH, Minerva, AMC, AIME).

The plain functions are importable for reuse; the reward class is
``rlcore_math.reward:MathReward`` (registered as ``math``). Importing this package loads
neither sympy nor math-verify; they load when a ``MathReward`` is built (or before the first
symbolic comparison), never under a deadline.
"""

from __future__ import annotations

from rlcore_math.extract import extract_answer, last_boxed_only_string, remove_boxed
from rlcore_math.normalize import normalize_answer
from rlcore_math.verify import check_equiv, is_equiv

__all__ = [
    "check_equiv",
    "extract_answer",
    "is_equiv",
    "last_boxed_only_string",
    "normalize_answer",
    "remove_boxed",
]
