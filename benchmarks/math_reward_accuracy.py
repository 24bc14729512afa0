"""Accuracy and false-positive rate of the ``math`` reward on the real maths data sets.

Usage: python benchmarks/math_reward_accuracy.py [--data DIR] [--seed 0]

For each data set: every reference solution scored against its own answer (accuracy), and
against the answer of another row from a seeded derangement (false positives; pairs whose
answers are truly equal are left out). Two configurations: string/number checks only, and
with math-verify. Prints a table, then every failure and false positive with its reason.
See ``rlcore_math.accuracy`` for how each data set is turned into pairs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rlcore_math.accuracy import DATASETS, evaluate, load_pairs
from rlcore_math.reward import MathReward

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / ".." / "shared" / "data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    configs = {
        "strings+numbers": MathReward.Config(use_math_verify=False),
        "+math-verify": MathReward.Config(use_math_verify=True),
    }
    header = f"{'dataset':<14}{'checks':<17}{'n':>5}{'correct':>9}{'acc':>8}"
    header += f"{'pairs':>7}{'FP':>5}{'FP rate':>9}{'equal':>7}{'ms/pair':>9}"
    print(header)
    print("-" * len(header))
    details = []
    for dataset in DATASETS:
        path = args.data / "math" / dataset / "test.jsonl"
        if not path.exists():
            print(f"{dataset:<14}missing: {path}")
            continue
        pairs = load_pairs(dataset, args.data)
        for name, config in configs.items():
            start = time.perf_counter()
            report = evaluate(dataset, pairs, MathReward(config), seed=args.seed)
            ms = 1000 * (time.perf_counter() - start) / (report.n + report.fp_pairs)
            print(
                f"{dataset:<14}{name:<17}{report.n:>5}{report.correct:>9}"
                f"{report.accuracy:>8.1%}{report.fp_pairs:>7}{report.false_positives:>5}"
                f"{report.fp_rate:>9.2%}{report.excluded_equal:>7}{ms:>9.2f}"
            )
            if name == "+math-verify":
                details.append(report)
    print("\n(equal: shuffled pairs left out because both answers are truly equal)")
    for report in details:
        for row, pred, answer, reason in report.failures:
            print(f"FAIL {report.dataset}[{row}]: pred={pred!r} answer={answer!r}: {reason}")
        for row, pred, other in report.fp_examples:
            print(f"FALSE POSITIVE {report.dataset}[{row}]: pred={pred!r} other answer={other!r}")


if __name__ == "__main__":
    main()
