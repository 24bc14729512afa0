"""The quickstart trained twice, on FSDP2 and on megatron TP=2, then both accuracy curves.

From the repository root (``rlcore-megatron`` and ``rlcore-fsdp2`` installed)::

    python plugins/engines/megatron/scripts/quickstart_vs_fsdp2.py            # 150 steps, seed 0
    python plugins/engines/megatron/scripts/quickstart_vs_fsdp2.py --steps 3 --test-freq 1 \\
        --out runs/megatron-vs-fsdp2-smoke -- --max-steps 20 --eval-from 10   # a smoke

Each run is ``examples/quickstart/run.sh`` (prepare.py, skipped when its outputs exist, then
``rlcore train examples/quickstart/grpo.toml``) with the same seed, steps and validation
cadence, on 2 processes: FSDP2 with DP=2 (``actor.engine.name = "fsdp2"``) and megatron with
``tensor_parallel = 2`` (one data-parallel group). Both generate with the HF rollout on both
processes, so their first rollouts are the same and the curves differ only where their
updates do. ``--fsdp2-processes 1`` runs FSDP2 as the quickstart does by default.
Arguments after ``--`` go to prepare.py. The table reads ``val/*/acc`` from each run's
``metrics.jsonl``; the runs stay in ``OUT/fsdp2`` and ``OUT/megatron-tp2``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def _train(name: str, run_dir: Path, args: argparse.Namespace, engine: list[str]) -> float:
    overrides = [
        f"trainer.total_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}",
        "trainer.val_before_train=true",
        *engine,
    ]
    cmd = [
        "bash",
        str(ROOT / "examples/quickstart/run.sh"),
        "--seed",
        str(args.seed),
        "--run-dir",
        str(run_dir),
        *args.prepare,
        "--",
        *overrides,
    ]
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return time.perf_counter() - start


def _curve(run_dir: Path) -> dict[int, float]:
    """Validation accuracy by step (the mean over data sources when there are several)."""
    curve: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        accs = [v for k, v in row.items() if k.startswith("val/") and k.endswith("/acc")]
        if accs:
            curve[int(row["step"])] = sum(accs) / len(accs)
    return curve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps (quickstart: 150)")
    parser.add_argument("--test-freq", type=int, default=10, help="validate every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "runs/megatron-vs-fsdp2")
    parser.add_argument("--fsdp2-processes", type=int, default=2, choices=(1, 2))
    parser.add_argument("--skip-fsdp2", action="store_true", help="reuse OUT/fsdp2")
    parser.add_argument("prepare", nargs="*", help="after --: prepare.py flags")
    args = parser.parse_args(argv)
    runs = {"fsdp2": args.out / "fsdp2", "megatron-tp2": args.out / "megatron-tp2"}
    engines = {
        "fsdp2": [
            'actor.engine.name="fsdp2"',
            f"resources.processes_per_node={args.fsdp2_processes}",
        ],
        "megatron-tp2": [
            'actor.engine.name="megatron"',
            "actor.engine.tensor_parallel=2",
            "resources.processes_per_node=2",
        ],
    }
    seconds: dict[str, float] = {}
    for name, run_dir in runs.items():
        if name == "fsdp2" and args.skip_fsdp2:
            continue
        seconds[name] = _train(name, run_dir, args, engines[name])
    curves = {name: _curve(run_dir) for name, run_dir in runs.items()}
    steps = sorted(set().union(*curves.values()))
    print(f"\nvalidation accuracy (seed {args.seed}, {args.steps} steps)")
    print(f"{'step':>5}  {'fsdp2':>8}  {'megatron-tp2':>12}")
    for step in steps:
        cells = [curves[n].get(step) for n in runs]
        text = [f"{c:.4f}" if c is not None else "-" for c in cells]
        print(f"{step:>5}  {text[0]:>8}  {text[1]:>12}")
    for name, curve in curves.items():
        if curve:
            first, last = curve[min(curve)], curve[max(curve)]
            best = max(curve.values())
            took = f", {seconds[name]:.0f} s" if name in seconds else ""
            print(f"{name}: {first:.4f} -> {last:.4f} (best {best:.4f}){took}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
