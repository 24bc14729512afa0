"""One-step-off and fully async against synchronous training, side by side, on the quickstart.

    python examples/quickstart/prepare.py --seed 0           # the warm start and data, once
    python benchmarks/one_step_off.py                        # 3 repeats x 4 modes, 12 steps each
    python benchmarks/one_step_off.py --repeats 1 --steps 6 --work-dir /tmp/qs
    python benchmarks/one_step_off.py --modes split,fully_async --max-staleness 2

Four modes of the same run (``examples/quickstart/grpo.toml`` on the seed's warm start), in
an interleaved order per repeat so that drift in the machine's load touches all of them:

- ``colocated``: the default, the rollout inside the policy worker (one process);
- ``split``: the rollout on a pool of its own (one more process), synchronous: the step is
  generation, then the update, then the weight sync;
- ``one_step_off``: the same placement with ``trainer.async_mode = "one_step_off"``: batch
  k+1 generates while batch k trains;
- ``fully_async``: ``trainer.async_mode = "fully_async"`` with ``trainer.max_staleness``
  (``--max-staleness``, default 2): a queue of that many batches generating ahead.

Per mode it prints the median and the min-max over repeats of the step time, the generation
(``timing_s/gen``: in one-step-off, the wait for the generation in flight), the actor update
and the weight sync, each the median over the steps after the first ``--skip`` (warm-up and
the synchronous first step of one-step-off), and the throughput in samples/s (the step's
samples over the step time; ``async/gen_samples_per_s`` and ``async/train_samples_per_s``
separately in the queued modes). The goal of issue 28: one-step-off step time <=
1.15 x max(generation, update) of the synchronous split run, which takes their sum. The
rewards are real (the warm start answers 25-50% right), so the update trains on mixed groups.
Measure on an otherwise idle machine: other work on the cores changes both terms.
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

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "quickstart" / "grpo.toml"
SPLIT = ["resources.pools.gen={processes_per_node=1}", 'resources.placement={rollout="gen"}']
MODES: dict[str, list[str]] = {
    "colocated": [],
    "split": SPLIT,
    "one_step_off": [*SPLIT, "trainer.async_mode=one_step_off"],
    "fully_async": [*SPLIT, "trainer.async_mode=fully_async"],
}
KEYS = ("step", "gen", "update_actor", "weight_sync")
RATES = ("samples_per_s", "gen_samples_per_s", "train_samples_per_s")


def run_mode(mode: str, args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    """Train ``args.steps`` steps in ``mode``; the per-step medians after ``args.skip``."""
    work = Path(args.work_dir)
    overrides = [
        f"model.path={work / f'seed{args.seed}' / 'model_sft'}",
        f'data.train_files=["{work / "data" / "train.parquet"}"]',
        "data.val_files=[]",
        f"data.seed={args.seed}",
        f"trainer.seed={args.seed}",
        f"trainer.total_steps={args.steps}",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "trainer.export_final=false",
        'trainer.loggers=["jsonl"]',
        f"trainer.run_dir={run_dir}",
        "trainer.resume=off",
        *MODES[mode],
    ]
    if mode == "fully_async":
        overrides.append(f"trainer.max_staleness={args.max_staleness}")
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "rlcore.cli", "train", str(CONFIG), *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if proc.returncode != 0:
        sys.exit(f"{mode}: rlcore train failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r and r["step"] > args.skip]
    out = {key: statistics.median(r.get(f"timing_s/{key}", 0.0) for r in steps) for key in KEYS}
    # Samples (prompts x n) per second of the step; the queued modes also log generation (the
    # rollout pool's) and training (the step less its wait for the generation) separately.
    out["samples_per_s"] = statistics.median(r["perf/samples_per_s"] for r in steps)
    for key in RATES[1:]:
        out[key] = statistics.median(r.get(f"async/{key}", float("nan")) for r in steps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default=str(REPO / "examples" / "quickstart" / "work"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="bound on one run")
    parser.add_argument("--max-staleness", type=int, default=2, help="fully_async's bound")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; known: {', '.join(MODES)}")
    if args.steps <= args.skip:
        parser.error("--steps must exceed --skip")
    model = Path(args.work_dir) / f"seed{args.seed}" / "model_sft"
    if not (model / "config.json").is_file():
        parser.error(f"no warm start at {model}: run examples/quickstart/prepare.py first")

    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="one-step-off-") as tmp:
        for repeat in range(args.repeats):
            order = modes if repeat % 2 == 0 else list(reversed(modes))
            for mode in order:
                run_dir = Path(tmp) / f"{mode}-{repeat}"
                results[mode].append(run_mode(mode, args, run_dir))
                print(f"repeat {repeat} {mode}: {results[mode][-1]}", flush=True)

    def cell(mode: str, key: str) -> str:
        vals = [r[key] for r in results[mode]]
        return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    print(
        f"\nquickstart seed {args.seed}, {args.steps} steps (first {args.skip} left out), "
        f"{args.repeats} repeats; median (min-max over repeats), seconds per step\n"
    )
    print(
        "| mode | step | gen | update_actor | weight_sync | samples/s | gen samples/s | "
        "train samples/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        print(f"| {mode} | " + " | ".join(cell(mode, k) for k in (*KEYS, *RATES)) + " |")
    if "split" not in results:
        return 0
    split = results["split"]
    bound = [max(r["gen"], r["update_actor"]) for r in split]
    sums = [s["step"] / b for s, b in zip(split, bound, strict=True)]
    print(f"\nsplit (synchronous) step / its max(gen, update): {statistics.median(sums):.2f}")
    for mode in ("one_step_off", "fully_async"):
        if mode in results:
            ratios = [o["step"] / b for o, b in zip(results[mode], bound, strict=True)]
            print(
                f"{mode} step / max(gen, update) of split: median "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}; "
                "goal <= 1.15)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
