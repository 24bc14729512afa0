"""Run the quickstart for several seeds, one after the other, and print the accuracy table.

    python examples/quickstart/seeds.py                       # seeds 0 1 2, ~11 min each
    python examples/quickstart/seeds.py --seeds 3 4           # other seeds
    python examples/quickstart/seeds.py --report runs/quickstart-seeds-<time>   # table only
    python examples/quickstart/seeds.py -- --force -- trainer.total_steps=2   # args for run.sh

Each seed runs ``bash examples/quickstart/run.sh --seed N --run-dir ROOT/seedN --force``
(a fresh warm start, then GRPO), in a fresh ROOT (``runs/quickstart-seeds-<UTC time>``
unless ``--root``). Then it prints, in markdown and into ROOT/summary.md:

- per seed: the warm start (steps, dev accuracy), the held-out accuracy before GRPO (step 0)
  and at the end, the gain, the mean of the last three validations (one 200-prompt
  evaluation has about +-3 points of sampling noise) and the wall times;
- the held-out accuracy at every validation step, seeds side by side;
- the min-max spread over the seeds.

Exit code 1 when a seed gains less than ``--min-gain`` or its training takes longer than
``--max-train-minutes`` (the quickstart's promise), 2 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUN_SH = HERE / "run.sh"


@dataclass
class SeedResult:
    seed: int
    run_dir: Path
    returncode: int = 0
    wall_s: float | None = None  # the whole run.sh, measured here
    prepare_s: float | None = None  # from quickstart_times.json (written by run.sh)
    train_s: float | None = None
    warm_steps: int | None = None  # from the warm start's warm_start.json
    warm_dev_acc: float | None = None
    curve: dict[int, float] = field(default_factory=dict)  # step -> held-out accuracy

    @property
    def start_acc(self) -> float | None:
        return self.curve.get(0)

    @property
    def final_acc(self) -> float | None:
        return self.curve[max(self.curve)] if self.curve else None

    @property
    def gain(self) -> float | None:
        if self.start_acc is None or self.final_acc is None or max(self.curve) == 0:
            return None
        return self.final_acc - self.start_acc

    @property
    def last3_mean(self) -> float | None:
        steps = sorted(s for s in self.curve if s > 0)[-3:]
        return sum(self.curve[s] for s in steps) / len(steps) if steps else None


def val_accuracy(metrics_file: Path) -> dict[int, float]:
    """step -> ``val/<source>/acc`` from a run's metrics.jsonl (the first data source's)."""
    from rlcore.tracking.plotting import load_metrics

    series = load_metrics(metrics_file)
    keys = sorted(k for k in series if k.startswith("val/") and k.endswith("/acc"))
    if not keys:
        return {}
    steps, values = series[keys[0]]
    return dict(zip(steps, values))


def collect(seed: int, run_dir: Path, work_dir: Path) -> SeedResult:
    """What one seed's run left on disk: its times, its warm start and its validation curve."""
    result = SeedResult(seed=seed, run_dir=run_dir)
    times = run_dir / "quickstart_times.json"
    if times.is_file():
        data = json.loads(times.read_text())
        result.prepare_s, result.train_s = data.get("prepare_s"), data.get("train_s")
    warm = work_dir / f"seed{seed}" / "model_sft" / "warm_start.json"
    if warm.is_file():
        data = json.loads(warm.read_text())
        result.warm_steps, result.warm_dev_acc = data.get("steps"), data.get("dev_acc")
    if (run_dir / "metrics.jsonl").is_file():
        result.curve = val_accuracy(run_dir / "metrics.jsonl")
    return result


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _spread(values: list[float | None], unit: str = "%") -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    if unit == "%":
        return f"{100 * min(got):.1f}-{100 * max(got):.1f}"
    return f"{min(got):.0f}-{max(got):.0f}"


def report(results: list[SeedResult]) -> str:
    """The markdown tables: one row per seed, then the curves, then the spread."""
    lines = [
        "| seed | warm-start steps | warm-start dev acc % | held-out acc % at step 0 "
        "| final acc % | gain (points) | mean of last 3 vals % | warm start s | training s "
        "| total s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        failed = "" if r.returncode == 0 else f" (exit {r.returncode})"
        lines.append(
            f"| {r.seed}{failed} | {r.warm_steps if r.warm_steps is not None else '-'} "
            f"| {_pct(r.warm_dev_acc)} | {_pct(r.start_acc)} | {_pct(r.final_acc)} "
            f"| {_pct(r.gain)} | {_pct(r.last3_mean)} | {_secs(r.prepare_s)} "
            f"| {_secs(r.train_s)} | {_secs(r.wall_s)} |"
        )
    steps = sorted({s for r in results for s in r.curve})
    if steps:
        lines += ["", "Held-out accuracy (%) at each validation step:", ""]
        lines.append("| step | " + " | ".join(f"seed {r.seed}" for r in results) + " |")
        lines.append("|---:|" + "---:|" * len(results))
        for s in steps:
            lines.append(f"| {s} | " + " | ".join(_pct(r.curve.get(s)) for r in results) + " |")
    lines += [
        "",
        f"Spread over {len(results)} seeds (min-max): "
        f"start {_spread([r.start_acc for r in results])} %, "
        f"final {_spread([r.final_acc for r in results])} %, "
        f"gain {_spread([r.gain for r in results])} points, "
        f"mean of last 3 validations {_spread([r.last3_mean for r in results])} %, "
        f"training {_spread([r.train_s for r in results], unit='s')} s.",
    ]
    return "\n".join(lines) + "\n"


def verdict(results: list[SeedResult], min_gain: float, max_train_minutes: float) -> int:
    """0 when every seed ran, gained >= min_gain and trained within the time; else 1 or 2."""
    code = 0
    for r in results:
        if r.returncode != 0:
            print(f"seed {r.seed}: the run failed (exit {r.returncode}); see {r.run_dir}")
            code = 2
            continue
        problems = []
        if r.gain is None or r.gain < min_gain:
            problems.append(f"gain {_pct(r.gain)} < {100 * min_gain:.0f} points")
        if r.train_s is not None and r.train_s > 60 * max_train_minutes:
            problems.append(f"training {r.train_s:.0f} s > {max_train_minutes:.0f} min")
        if problems:
            print(f"seed {r.seed}: " + "; ".join(problems))
            code = max(code, 1)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # everything after the first -- goes to run.sh unchanged
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--root", type=Path, default=None, help="folder for the seeds' runs")
    parser.add_argument(
        "--report", type=Path, default=None, metavar="ROOT", help="only print ROOT's table"
    )
    parser.add_argument("--work-dir", type=Path, default=HERE / "work", help="prepare.py's")
    parser.add_argument(
        "--reuse-warm-start",
        action="store_true",
        help="keep warm starts already in --work-dir (default: redo them, timed)",
    )
    parser.add_argument("--min-gain", type=float, default=0.20)
    parser.add_argument("--max-train-minutes", type=float, default=10.0)
    args = parser.parse_args(argv)

    if args.report is not None:
        root = args.report
        seeds = args.seeds if "--seeds" in argv else _seeds_in(root)
        results = [collect(s, root / f"seed{s}", args.work_dir) for s in seeds]
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        root = args.root or REPO / "runs" / f"quickstart-seeds-{stamp}"
        if root.exists() and any(root.iterdir()):
            parser.error(f"{root} is not empty: pass a new --root (runs would resume, not start)")
        root.mkdir(parents=True, exist_ok=True)
        results = []
        for seed in args.seeds:
            run_dir = root / f"seed{seed}"
            cmd = ["bash", str(RUN_SH), "--seed", str(seed), "--run-dir", str(run_dir)]
            cmd += ["--work-dir", str(args.work_dir)]
            # A measurement redoes the warm start (its time and accuracy are in the table)
            # unless told to reuse an earlier one.
            cmd += [] if args.reuse_warm_start else ["--force"]
            print(f"=== seed {seed}: {' '.join(cmd + passthrough)}", flush=True)
            t0 = time.monotonic()
            proc = subprocess.run(cmd + passthrough, cwd=REPO, check=False)
            result = collect(seed, run_dir, args.work_dir)
            result.returncode, result.wall_s = proc.returncode, time.monotonic() - t0
            results.append(result)
    table = report(results)
    print(table, end="")
    (root / "summary.md").write_text(table)
    print(f"(also in {root / 'summary.md'})")
    return verdict(results, args.min_gain, args.max_train_minutes)


def _seeds_in(root: Path) -> list[int]:
    found = sorted(int(p.name[4:]) for p in root.glob("seed*") if p.name[4:].isdigit())
    if not found:
        msg = f"no seed<N> run folders under {root}"
        raise SystemExit(f"error: {msg}")
    return found


if __name__ == "__main__":
    sys.exit(main())
