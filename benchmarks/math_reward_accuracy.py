"""Accuracy and false positives of the ``math`` reward on the real maths data sets.

Usage: python benchmarks/math_reward_accuracy.py [--data DIR] [--seed 0] [--datasets ...]

For MATH-500, Minerva, AMC23 and AIME24 (``DIR/math/NAME/test.jsonl``) it prints one table
row per data set and configuration (string/number checks only, and with math-verify):

- ``self``: reference solutions scored against their own answers (correct / rows);
- ``shifted FP``: each solution against another row's answer (seeded derangement; pairs whose
  answers are truly equal are left out and listed at the end);
- ``digit FP``: the answer with one digit changed, boxed, against the answer;

then each rewrite kind's acceptance (equivalent rewrites of the answer, boxed, against it:
``\\text{}``, ``\\dfrac``, ``x =``, spaces, ``\\left(``, decimals, an unbraced ``\\boxed``),
and every failure / false positive / truly-equal pair with its reason. Timings are wall
clock on whatever else the machine runs. See :mod:`rlcore_math.accuracy` for the pairs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rlcore_math.accuracy import DATASETS, REWRITES, evaluate, load_pairs
from rlcore_math.reward import MathReward

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO / ".." / "shared" / "data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--datasets", nargs="*", default=list(DATASETS))
    args = parser.parse_args()

    configs = {
        "strings+numbers": MathReward.Config(use_math_verify=False),
        "+math-verify": MathReward.Config(use_math_verify=True),
    }
    header = f"{'dataset':<14}{'checks':<17}{'self':>10}{'shifted FP':>12}{'digit FP':>10}"
    header += f"{'equal':>7}{'s':>6}"
    print(header)
    print("-" * len(header))
    reports = []
    for dataset in args.datasets:
        path = args.data / "math" / dataset / "test.jsonl"
        if not path.exists():
            print(f"{dataset:<14}missing: {path}")
            continue
        pairs = load_pairs(dataset, args.data)
        for name, config in configs.items():
            start = time.perf_counter()
            report = evaluate(dataset, pairs, MathReward(config), seed=args.seed)
            seconds = time.perf_counter() - start
            digit_fp = f"{len(report.changed_false_positives)}/{report.changed_pairs}"
            print(
                f"{dataset:<14}{name:<17}{f'{report.correct}/{report.n}':>10}"
                f"{f'{report.false_positives}/{report.fp_pairs}':>12}{digit_fp:>10}"
                f"{report.excluded_equal:>7}{seconds:>6.0f}"
            )
            reports.append((name, report))

    print("\nRewrites accepted (with math-verify), accepted/applicable:")
    kinds = list(REWRITES)
    print(f"{'dataset':<14}" + "".join(f"{k:>14}" for k in kinds))
    for name, report in reports:
        if name != "+math-verify":
            continue
        cells = []
        for kind in kinds:
            applies, accepted, _ = report.rewrites.get(kind, (0, 0, []))
            cells.append(f"{accepted}/{applies}" if applies else "-")
        print(f"{report.dataset:<14}" + "".join(f"{c:>14}" for c in cells))

    print("\n(equal: shifted pairs left out because both answers are truly equal; listed below)")
    for name, report in reports:
        if name != "+math-verify":
            continue
        ds = report.dataset
        for row, pred, answer, reason in report.failures:
            print(f"FAIL {ds}[{row}]: pred={pred!r} answer={answer!r}: {reason}")
        for row, pred, other in report.fp_examples:
            print(f"SHIFTED FALSE POSITIVE {ds}[{row}]: pred={pred!r} other answer={other!r}")
        for row, changed, answer in report.changed_false_positives:
            print(f"DIGIT FALSE POSITIVE {ds}[{row}]: {changed!r} accepted for {answer!r}")
        for row, a, b in report.excluded_pairs:
            print(f"TRULY EQUAL (shifted) {ds}[{row}]: {a!r} == {b!r}")
        for row, changed, answer in report.changed_excluded:
            print(f"TRULY EQUAL (digit) {ds}[{row}]: {changed!r} == {answer!r}")
        for kind, (_, _, rejected) in report.rewrites.items():
            for row, new, answer in rejected:
                print(f"REWRITE REJECTED {ds}[{row}] {kind}: {new!r} for {answer!r}")


if __name__ == "__main__":
    main()
