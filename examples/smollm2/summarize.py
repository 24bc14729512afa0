"""One line per SmolLM2 run: held-out accuracy over training, time, weight sync and memory.

    python examples/smollm2/summarize.py runs/smollm2-*

Reads each run directory's ``metrics.jsonl`` (what ``rlcore train`` writes) and prints, per run:
the held-out greedy accuracy at every validation and its gain, the training time (the steps'
``timing_s/step`` plus the validations' ``timing_s/validate``; the workers' start-up is not
in it), the median step, the weight sync per step (bytes and the slowest rank's seconds) and
the largest peak resident memory of any process (``perf/peak_rss_gb/*``). Then the gains'
mean and spread over the runs of each config, seeds grouped by the run directory's stem
(``runs/smollm2-grpo-seed1`` -> ``smollm2-grpo``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ACC = re.compile(r"^val/.*/acc$")


def summarize(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = {}
    for row in rows:
        accs = [v for k, v in row.items() if ACC.match(k)]
        if accs:
            val[row["step"]] = statistics.fmean(accs)
    steps = [r for r in rows if "timing_s/step" in r]
    rss = [v for r in rows for k, v in r.items() if k.startswith("perf/peak_rss_gb/")]
    sync_bytes = [r["perf/weight_sync_bytes"] for r in steps if "perf/weight_sync_bytes" in r]
    sync_s = [r["timing_s/worker/weight_sync"] for r in steps if "timing_s/worker/weight_sync" in r]
    return {
        "run": run.name,
        "val": val,
        "steps": len(steps),
        "train_s": sum(r["timing_s/step"] for r in steps)
        + sum(r.get("timing_s/validate", 0.0) for r in rows),
        "step_s": statistics.median(r["timing_s/step"] for r in steps) if steps else None,
        "sync_bytes": statistics.median(sync_bytes) if sync_bytes else None,
        "sync_s": statistics.median(sync_s) if sync_s else None,
        "rss_gb": max(rss) if rss else None,
        "train_acc": [r.get("critic/score/mean") for r in steps],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (trainer.run_dir)")
    args = parser.parse_args(argv)
    found = [r for r in args.runs if (r / "metrics.jsonl").is_file()]
    if not found:
        print("summarize: none of the given directories holds a metrics.jsonl")
        return 2
    print(
        f"{'run':<32}{'held-out acc % by step':<30}{'gain':>7}{'steps':>6}{'train min':>10}"
        f"{'step s':>8}{'sync MB':>9}{'sync s':>8}{'peak GB':>8}"
    )
    gains: dict[str, list[float]] = {}
    for run in found:
        s = summarize(run)
        accs = " ".join(f"{step}:{100 * acc:.1f}" for step, acc in sorted(s["val"].items()))
        first, last = min(s["val"], default=None), max(s["val"], default=None)
        gain = 100 * (s["val"][last] - s["val"][first]) if first is not None else float("nan")
        if first is not None and last != first:  # a run still before its second validation
            gains.setdefault(re.sub(r"-seed\d+$", "", s["run"]), []).append(gain)

        def cell(value, scale=1.0, fmt=".2f"):
            return format(value * scale, fmt) if value is not None else "-"

        print(
            f"{s['run']:<32}{accs:<30}{gain:>+7.1f}{s['steps']:>6}{s['train_s'] / 60:>10.1f}"
            f"{cell(s['step_s'], fmt='.1f'):>8}{cell(s['sync_bytes'], 1e-6, '.0f'):>9}"
            f"{cell(s['sync_s']):>8}{cell(s['rss_gb']):>8}"
        )
    print()
    for name, values in gains.items():
        spread = f"{min(values):+.1f} to {max(values):+.1f}" if len(values) > 1 else "one run"
        print(f"{name}: gain {statistics.fmean(values):+.1f} points over {len(values)} ({spread})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
