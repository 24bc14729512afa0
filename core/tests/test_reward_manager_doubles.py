"""Test doubles for the reward manager tests (no tests here).

They live in their own module, imported by plain name after the tests put this folder on
``sys.path``, so that pool workers (fresh processes, which get the parent's ``sys.path``)
can unpickle them. A test module loaded by pytest's importlib mode could not be re-imported.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import attrs

from rlcore.interfaces import BaseReward


class ScriptedReward(BaseReward):
    """Exact match of the stripped text, unless the text carries a trigger word:

    SLEEP sleeps for an hour, BOMB runs a catastrophic regex, RAISE raises, STUCK blocks
    SIGALRM and sleeps (only a kill ends it), CLOOP loops in C for hours holding the GIL
    (``sum(range(10**13))``: no alarm interrupts it), DIE exits the process, NAN returns
    NaN, TEXT returns a string, NONE returns None, INF returns inf, NULLSCORE returns
    ``{"score": None}``.
    """

    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        value: float = 1.0

    def __init__(self, config: ScriptedReward.Config | None = None) -> None:
        super().__init__(config or ScriptedReward.Config())

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> Any:
        if "SLEEP" in solution_str:
            time.sleep(3600)
        if "BOMB" in solution_str:
            re.match(r"(a+)+$", "a" * 64 + "b")
        if "RAISE" in solution_str:
            msg = "scripted failure"
            raise ValueError(msg)
        if "STUCK" in solution_str:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        if "CLOOP" in solution_str:
            sum(range(10**13))
        if "DIE" in solution_str:
            os._exit(3)
        if "NAN" in solution_str:
            return float("nan")
        if "TEXT" in solution_str:
            return "high"
        if "NONE" in solution_str:
            return None
        if "INF" in solution_str:
            return float("inf")
        if "NULLSCORE" in solution_str:
            return {"score": None, "acc": True}
        hit = solution_str.strip() == str(ground_truth)
        return {
            "score": self.config.value if hit else 0.0,
            "acc": hit,
            "pred": solution_str.strip(),
            "index": (extra_info or {}).get("index"),
        }


class LengthReward(BaseReward):
    """A plain float: the number of characters, for weighting tests."""

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> float:
        return float(len(solution_str))


class UnpicklableReward(ScriptedReward):
    """Holds a lambda, so it cannot travel to a pool worker."""

    def __init__(self) -> None:
        super().__init__()
        self.hook = lambda x: x


class ReasonReward(BaseReward):
    """Exact match, with a ``reason`` ("pass", "fail"); a response "plain" gives a bare float."""

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> Any:
        if solution_str.strip() == "plain":
            return 0.0
        hit = solution_str.strip() == str(ground_truth)
        return {"score": float(hit), "reason": "pass" if hit else "fail"}


class ExtrasReward(BaseReward):
    """Exact match with extras: a bool, a number, a string, and a NaN on "nan" responses."""

    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> Any:
        text = solution_str.strip()
        hit = text == str(ground_truth)
        out = {"score": float(hit), "used_tool": hit, "length": len(text), "pred": text}
        if text == "nan":
            out["length"] = float("nan")
        return out
