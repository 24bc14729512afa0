"""Partial rollouts on and off, alternated, in a tiny fully-async run with vLLM on its own pool.

    /work/main/.venv-vllm/bin/python benchmarks/partial_rollouts.py            # 2 repeats
    /work/main/.venv-vllm/bin/python benchmarks/partial_rollouts.py --repeats 1 --steps 6

Runs in the vLLM environment (``bash scripts/test_vllm.sh`` builds it; this tree's source
folders on ``PYTHONPATH``). The tiny model of ``rlcore.testing.runs`` with the vLLM rollout
(``async_engine = true``, 64 MiB KV cache) on pool ``gen``, ``trainer.async_mode =
"fully_async"`` with ``--max-staleness`` (default 1), ``--response-length`` tokens (default
128: long enough for the sync to land mid-batch), ``rollout.partial_rollouts`` off then on per
repeat, each run in a process of its own. Per run and step after the first: the step time,
the sync (``timing_s/weight_sync``: without partial rollouts it waits for the batch), the
generation inside the worker (``timing_s/worker/generate``), the trainer's wait
(``async/trainer_idle_s``), ``rollout/continued_samples``, and the weight versions of the
trained rows (``trainer.rollout_data_dir``: each row's oldest token's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

KEYS = (
    "timing_s/step",
    "timing_s/weight_sync",
    "timing_s/worker/generate",
    "async/trainer_idle_s",
    "rollout/continued_samples",
)


def one_run(work: Path, *, partial: bool, steps: int, staleness: int, response: int) -> None:
    """One training run (in this process); its metrics land in ``work/run``."""
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(work / "model")
    train = write_jsonl(arithmetic_rows([(i, i + 1) for i in range(8)]), work / "train.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=work / "run",
        total_steps=steps,
        lr=1e-2,
        algorithm_options='rollout_is = "token"\nentropy_coeff = 0.1',
        extra='placement = { rollout = "gen" }\n[resources.pools.gen]\nprocesses_per_node = 1\n',
    )
    text = text.replace(
        'name = "hf"',
        'name = "vllm"\nkv_cache_space_gb = 0.0625\nasync_engine = true\n'
        f"partial_rollouts = {str(partial).lower()}",
    ).replace("max_response_length = 8", f"max_response_length = {response}")
    text = text.replace(
        "[trainer]\n",
        f'[trainer]\nasync_mode = "fully_async"\nmax_staleness = {staleness}\n'
        f'rollout_data_dir = "{work / "samples"}"\n',
        1,
    )
    if run_training(load_config_text(text, source="partial_rollouts.toml")) != 0:
        sys.exit(f"the run in {work} failed")


def report(work: Path, label: str) -> None:
    rows = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "actor/pg_loss" in r and r["step"] > 1:
            cells = ", ".join(f"{k.split('/')[-1]} {r.get(k, float('nan')):.2f}" for k in KEYS)
            print(f"{label} step {r['step']}: {cells}")
    for f in sorted((work / "samples").glob("*.jsonl"), key=lambda p: int(p.stem)):
        versions = sorted({json.loads(line)["weight_version"] for line in f.open()})
        print(f"{label} step {f.stem}: trained rows' weight versions {versions}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--response-length", type=int, default=128)
    ap.add_argument("--work-dir", type=Path, default=None)
    ap.add_argument("--one", choices=("on", "off"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="partial-rollouts-"))
    if args.one:
        one_run(
            work,
            partial=args.one == "on",
            steps=args.steps,
            staleness=args.max_staleness,
            response=args.response_length,
        )
        return
    for rep in range(args.repeats):
        for mode in ("off", "on"):
            run_dir = work / f"{mode}-{rep}"
            cmd = [sys.executable, __file__, "--one", mode, "--work-dir", str(run_dir)]
            cmd += ["--steps", str(args.steps), "--max-staleness", str(args.max_staleness)]
            cmd += ["--response-length", str(args.response_length)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            report(run_dir, f"partial {mode}, repeat {rep}")


if __name__ == "__main__":
    main()
