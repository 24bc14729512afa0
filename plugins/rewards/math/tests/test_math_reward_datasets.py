"""MATH-500: reference solutions score >= 99%, shuffled pairs <= 0.5% false positives."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore_math.accuracy import evaluate, load_pairs

DATA = Path(__file__).resolve().parents[4] / ".." / "shared" / "data"
MATH500 = DATA / "math" / "math500" / "test.jsonl"


@pytest.mark.slow
@pytest.mark.skipif(not MATH500.exists(), reason=f"MATH-500 data not found at {MATH500}")
def test_math500_accuracy_and_false_positives():
    report = evaluate("math500", load_pairs("math500", DATA))
    assert report.n == 500
    assert report.correct >= 495, report.failures
    assert report.fp_pairs >= 490
    assert report.false_positives <= 0.005 * report.fp_pairs, report.fp_examples


@pytest.mark.parametrize("dataset", ["aime24", "amc23"])
def test_small_sets(dataset):
    path = DATA / "math" / dataset / "test.jsonl"
    if not path.exists():
        pytest.skip(f"{dataset} data not found at {path}")
    report = evaluate(dataset, load_pairs(dataset, DATA))
    assert report.false_positives == 0, report.fp_examples
    assert report.accuracy >= 0.95, report.failures
