"""MATH-500: 500/500 reference solutions, 0 shifted and 0 changed-digit false positives."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore_math.accuracy import evaluate, load_pairs
from rlcore_math.reward import MathReward

DATA = Path(__file__).resolve().parents[4] / ".." / "shared" / "data"
MATH500 = DATA / "math" / "math500" / "test.jsonl"


@pytest.mark.skipif(not MATH500.exists(), reason=f"MATH-500 data not found at {MATH500}")
def test_math500_self_shifted_and_changed_digit():
    report = evaluate("math500", load_pairs("math500", DATA))
    assert report.n == 500
    assert report.correct == 500, report.failures
    assert report.fp_pairs >= 490
    assert report.false_positives == 0, report.fp_examples
    # One digit of every answer that has one changed (seeded): never accepted.
    assert report.changed_pairs >= 480
    assert report.changed_false_positives == [], report.changed_false_positives
    # Equivalent rewrites of the answer are accepted (\text{} around it, \dfrac, x =, ...).
    for kind, (applies, accepted, rejected) in report.rewrites.items():
        assert accepted == applies, (kind, rejected[:5])


@pytest.mark.slow
@pytest.mark.skipif(not MATH500.exists(), reason=f"MATH-500 data not found at {MATH500}")
def test_math500_every_digit_changed_is_rejected():
    # Every digit position of every answer, two replacement digits each (~2300 pairs).
    reward = MathReward()
    accepted = []
    for row, pair in enumerate(load_pairs("math500", DATA)):
        answer = str(pair.answer)
        for k, ch in enumerate(answer):
            if not ch.isdigit():
                continue
            for d in {str((int(ch) + 1) % 10), str((int(ch) + 5) % 10)}:
                changed = answer[:k] + d + answer[k + 1 :]
                if reward.score("math500", f"$\\boxed{{{changed}}}$", pair.answer)["acc"]:
                    accepted.append((row, changed, answer))
    assert accepted == []


@pytest.mark.parametrize("dataset", ["aime24", "amc23"])
def test_small_sets(dataset):
    path = DATA / "math" / dataset / "test.jsonl"
    if not path.exists():
        pytest.skip(f"{dataset} data not found at {path}")
    report = evaluate(dataset, load_pairs(dataset, DATA))
    assert report.false_positives == 0, report.fp_examples
    assert report.accuracy >= 0.95, report.failures
