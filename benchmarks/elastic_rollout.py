"""Samples/s of a fully-async run with 1 and with 2 rollout replicas, side by side.

    python benchmarks/elastic_rollout.py                      # 3 repeats x {1, 2}, 8 steps
    python benchmarks/elastic_rollout.py --prompts 4 --n 16 --response-length 192   # heavier update

The run is the tests' tiny model (hidden 64, 1 layer) on the arithmetic prompts, the rollout
on a pool of its own (one process), ``trainer.async_mode = "fully_async"``,
``trainer.max_staleness = 2``; by default few rows with long responses (2 prompts x 4
samples, up to 512 tokens), so that generation, not the update, sets the pace (the case a
second replica is for). Measured on the idle 2-core machine: 2 replicas / 1 = 1.10-1.78x
samples/s over 5 repeats; with a heavier update (4 x 16 of 192 tokens) 0.82-0.92x, since two
cores cannot hold two replicas and the trainer (docs/fault-tolerance.md). The 2-replica run asks for
its second replica with ``rlcore scale RUN_DIR rollout=2`` before it starts (the control file
is read before step 1), so both runs have the same steps. Each run is ``rlcore train`` in a
process of its own (its own Ray); the two counts alternate within a repeat, in an order that
flips each repeat, so drift in the machine's load touches both.

Printed per count: samples/s over the steps after the first ``--skip`` (their samples over
the sum of their step times), median and min-max over repeats, the median
``timing_s/gen`` (the trainer's wait for its batch) and the ratio 2/1 per repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _config(root: Path, run_dir: Path, args: argparse.Namespace) -> str:
    from rlcore.testing.runs import tiny_run_toml

    text = tiny_run_toml(
        model=root / "model",
        train_files=[root / "train.jsonl"],
        run_dir=run_dir,
        total_steps=args.steps,
        train_batch_size=args.prompts,
        n=args.n,
        seed=0,
        extra=('placement = { rollout = "gen" }\n[resources.pools.gen]\nprocesses_per_node = 1\n'),
    )
    text = text.replace(
        "max_response_length = 8", f"max_response_length = {args.response_length}", 1
    )
    trainer = 'async_mode = "fully_async"\nmax_staleness = 2\nexport_final = false\n'
    return text.replace("[trainer]\n", f"[trainer]\n{trainer}", 1)


def run(replicas: int, root: Path, run_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """One ``rlcore train``; samples/s and the median generation wait after ``args.skip``."""
    from rlcore.trainer.elastic import request_scale

    run_dir.mkdir(parents=True)
    config = run_dir / "config.toml"
    config.write_text(_config(root, run_dir, args))
    if replicas > 1:
        request_scale(run_dir, replicas)  # read by the driver before step 1
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "rlcore.cli", "train", str(config)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode != 0:
        sys.exit(
            f"{replicas} replica(s): rlcore train failed ({proc.returncode}):\n"
            f"{proc.stderr[-3000:]}"
        )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r and r["step"] > args.skip]
    seen = {int(r["fault/rollout_replicas"]) for r in steps}
    if seen != {replicas}:
        sys.exit(f"asked for {replicas} replica(s), the run had {sorted(seen)}")
    samples = len(steps) * args.prompts * args.n
    return {
        "samples_per_s": samples / sum(r["timing_s/step"] for r in steps),
        "gen_wait_s": statistics.median(r.get("timing_s/gen", 0.0) for r in steps),
        "step_s": statistics.median(r["timing_s/step"] for r in steps),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="bound on one run")
    args = parser.parse_args()
    if args.steps <= args.skip:
        parser.error("--steps must exceed --skip")
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="elastic-rollout-") as tmp:
        root = Path(tmp)
        tiny_run_model(root / "model")
        write_jsonl(
            arithmetic_rows([(a, b) for a in range(8) for b in range(8)]), root / "train.jsonl"
        )
        for repeat in range(args.repeats):
            for replicas in (1, 2) if repeat % 2 == 0 else (2, 1):
                out = run(replicas, root, root / f"r{replicas}-{repeat}", args)
                results[replicas].append(out)
                print(f"repeat {repeat}, {replicas} replica(s): {out}", flush=True)

    print(
        f"\ntiny model, fully_async (max_staleness 2), {args.steps} steps (first {args.skip} "
        f"left out), {args.prompts} prompts x {args.n} samples, responses up to "
        f"{args.response_length} tokens, {args.repeats} repeats; median (min-max)\n"
    )
    print("| rollout replicas | samples/s | step s | gen wait s |")
    print("|---:|---:|---:|---:|")
    for replicas, rows in results.items():
        cells = []
        for key in ("samples_per_s", "step_s", "gen_wait_s"):
            vals = [r[key] for r in rows]
            cells.append(f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})")
        print(f"| {replicas} | " + " | ".join(cells) + " |")
    ratios = [
        b["samples_per_s"] / a["samples_per_s"] for a, b in zip(results[1], results[2], strict=True)
    ]
    print(f"\nsamples/s, 2 replicas / 1 per repeat: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"load average at the end: {os.getloadavg()}; cores: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
