"""Accuracy and false-positive rate of the reward on reference solutions of real data sets.

Used by ``benchmarks/math_reward_accuracy.py`` (all data sets, a table) and by the tests
(MATH-500 thresholds). Each data set gives (response, answer) pairs:

- ``math500``: the reference ``solution`` against its ``answer``;
- ``minerva_math``: the ``solution`` against the boxed answer of that same solution (the
  data set has no separate answer field, so this checks extraction and self-consistency);
- ``aime24``: the AoPS ``solution`` against the zero-padded ``answer`` ("025");
- ``amc23``: no solutions; the response is ``The answer is $\\boxed{27.0}$`` built from the
  float ``answer``, scored against that float.

False positives: each response against the answer of another row (a seeded derangement),
skipping pairs whose answers are truly equal (equal normalised strings or numbers).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from rlcore_math.extract import last_boxed_only_string, remove_boxed
from rlcore_math.reward import MathReward
from rlcore_math.verify import check_equiv

__all__ = ["DATASETS", "AccuracyReport", "evaluate", "load_pairs"]

DATASETS = ("math500", "minerva_math", "amc23", "aime24")


@attrs.frozen(kw_only=True)
class Pair:
    response: str
    answer: Any  # as stored (str, or float for amc23)


@attrs.frozen(kw_only=True)
class AccuracyReport:
    dataset: str
    n: int
    correct: int
    fp_pairs: int  # shuffled pairs compared (truly-equal pairs excluded)
    false_positives: int
    excluded_equal: int
    failures: list[tuple[int, str, str, str]]  # (row, pred, answer, reason)
    fp_examples: list[tuple[int, str, str]]  # (row, pred, other answer)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.n, 1)

    @property
    def fp_rate(self) -> float:
        return self.false_positives / max(self.fp_pairs, 1)


def load_pairs(dataset: str, data_dir: Path) -> list[Pair]:
    """The (response, answer) pairs of one data set under ``data_dir/math/NAME/test.jsonl``."""
    path = data_dir / "math" / dataset / "test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    pairs = []
    for row in rows:
        if dataset == "minerva_math":
            boxed = last_boxed_only_string(row["solution"])
            answer = remove_boxed(boxed) if boxed is not None else ""
            pairs.append(Pair(response=row["solution"], answer=answer))
        elif dataset == "amc23":
            pairs.append(
                Pair(response=f"The answer is $\\boxed{{{row['answer']}}}$.", answer=row["answer"])
            )
        else:
            pairs.append(Pair(response=row["solution"], answer=row["answer"]))
    return pairs


def _derangement(n: int, seed: int) -> list[int]:
    # A random cycle: row order[i] is paired with the answer of row order[i+1], never itself.
    order = list(range(n))
    random.Random(seed).shuffle(order)
    other = [0] * n
    for i in range(n):
        other[order[i]] = order[(i + 1) % n]
    return other


def evaluate(
    dataset: str, pairs: Iterable[Pair], reward: MathReward | None = None, seed: int = 0
) -> AccuracyReport:
    """Score every pair and its deranged counterpart with ``reward``."""
    reward = reward if reward is not None else MathReward(MathReward.Config())
    pairs = list(pairs)
    failures: list[tuple[int, str, str, str]] = []
    correct = 0
    for i, pair in enumerate(pairs):
        out = reward.score(dataset, pair.response, pair.answer)
        if out["acc"]:
            correct += 1
            continue
        pred = out["pred"]
        if pred is None:
            reason = "no answer extracted"
        else:
            reason = "judged different: " + check_equiv(pred, str(pair.answer))[1]
        failures.append((i, str(pred), str(pair.answer), reason))
    fp = compared = excluded = 0
    fp_examples: list[tuple[int, str, str]] = []
    for i, j in enumerate(_derangement(len(pairs), seed)):
        a_i, a_j = str(pairs[i].answer), str(pairs[j].answer)
        if check_equiv(a_i, a_j, use_math_verify=False)[0]:
            excluded += 1
            continue
        compared += 1
        out = reward.score(dataset, pairs[i].response, pairs[j].answer)
        if out["acc"]:
            fp += 1
            fp_examples.append((i, str(out["pred"]), a_j))
    return AccuracyReport(
        dataset=dataset,
        n=len(pairs),
        correct=correct,
        fp_pairs=compared,
        false_positives=fp,
        excluded_equal=excluded,
        failures=failures,
        fp_examples=fp_examples,
    )
