"""Bit-identical asynchronous resume on the quickstart: SIGKILL after a checkpoint, then resume.

For each mode (``one_step_off``; ``fully_async`` with ``max_staleness = 2``), with the rollout
on a pool of its own (``gen``, one process):

1. an unbroken run of ``--steps`` steps (``bash examples/quickstart/run.sh --seed S``);
2. the same command in another run directory, its process group (the driver and its local
   Ray: workers, raylet) SIGKILLed as soon as ``checkpoints/latest`` names step ``--kill-after``
   (checkpoints every ``--save-freq`` steps, so the generations queued ahead are in it);
3. the same command again: it resumes (``trainer.resume = "auto"``) and finishes;

Validation is off unless ``--validate`` (it changes no weights, and costs minutes on a loaded
machine). Then the two exported final models (``final_hf/*.safetensors``) are compared with
``torch.equal``, tensor by tensor. Prints one JSON line per mode and exits 1 if any differ.
Run from the repository root after ``python examples/quickstart/prepare.py --seed S``::

    python benchmarks/async_resume.py --seed 0 --steps 20 --kill-after 10 --out /tmp/ar
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLIT = ["resources.pools.gen={processes_per_node=1}", 'resources.placement={rollout="gen"}']
MODES = {
    "one_step_off": ["trainer.async_mode=one_step_off"],
    "fully_async": ["trainer.async_mode=fully_async", "trainer.max_staleness=2"],
}


def command(args: argparse.Namespace, mode: str, run_dir: Path) -> list[str]:
    return [
        "bash",
        str(REPO / "examples" / "quickstart" / "run.sh"),
        "--seed",
        str(args.seed),
        "--work-dir",
        args.work_dir,
        "--run-dir",
        str(run_dir),
        "--",
        f"trainer.total_steps={args.steps}",
        f"trainer.save_freq={args.save_freq}",
        *SPLIT,
        *MODES[mode],
        *([] if args.validate else ["trainer.test_freq=0", "trainer.val_before_train=false"]),
    ]


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: the kill takes Ray's processes too
    )


def finish(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> float:
    start_t = time.monotonic()
    try:
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0:
        sys.exit(f"run failed (exit {rc}), see {log}:\n{log.read_text()[-3000:]}")
    return time.monotonic() - start_t


def latest(run_dir: Path) -> str | None:
    try:
        return (run_dir / "checkpoints" / "latest").read_text().strip()
    except FileNotFoundError:
        return None


def kill_after(proc: subprocess.Popen[bytes], run_dir: Path, step: int, timeout_s: float) -> None:
    target = f"global_step_{step}"
    deadline = time.monotonic() + timeout_s
    try:
        while latest(run_dir) != target:
            if proc.poll() is not None:
                sys.exit(f"the run ended before {target}")
            if time.monotonic() > deadline:
                sys.exit(f"no {target} within {timeout_s} s")
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    if latest(run_dir) != target:
        sys.exit(f"killed too late: latest is {latest(run_dir)}")


def weights(run_dir: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    out: dict[str, object] = {}
    for file in sorted((run_dir / "final_hf").glob("*.safetensors")):
        out |= load_file(file)
    if not out:
        sys.exit(f"no exported weights in {run_dir / 'final_hf'}")
    return out


def measure(args: argparse.Namespace, mode: str, out: Path) -> dict[str, object]:
    import torch

    ref_dir, run_dir = out / f"{mode}-ref", out / f"{mode}-killed"
    ref_log, log = out / f"{mode}-ref.log", out / f"{mode}-killed.log"
    ref_s = finish(start(command(args, mode, ref_dir), ref_log), ref_log, args.timeout_s)
    proc = start(command(args, mode, run_dir), log)
    kill_after(proc, run_dir, args.kill_after, args.timeout_s)
    queued = sorted(
        p.name for p in (run_dir / "checkpoints" / latest(run_dir) / "async_queue").glob("*.pt")
    )
    resume_s = finish(start(command(args, mode, run_dir), log), log, args.timeout_s)
    ref, got = weights(ref_dir), weights(run_dir)
    differ = [k for k in ref if k not in got or not torch.equal(ref[k], got[k])]  # type: ignore[arg-type]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in rows if r["step"] == args.kill_after + 1 and "training/staleness" in r]
    return {
        "mode": mode,
        "steps": args.steps,
        "killed_after": args.kill_after,
        "queued_at_kill": queued,
        "resumed_step_staleness": resumed[-1]["training/staleness"] if resumed else None,
        "tensors": len(ref),
        "tensors_differing": differ,
        "bit_identical": not differ and ref.keys() == got.keys(),
        "unbroken_s": round(ref_s, 1),
        "resume_s": round(resume_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-freq", type=int, default=5)
    parser.add_argument("--kill-after", type=int, default=10)
    parser.add_argument("--modes", default="one_step_off,fully_async")
    parser.add_argument("--work-dir", default="examples/quickstart/work")
    parser.add_argument("--out", default="runs/async_resume")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument(
        "--validate", action="store_true", help="keep the quickstart's validations (slower)"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=False)
    ok = True
    for mode in args.modes.split(","):
        result = measure(args, mode, out)
        print(json.dumps(result), flush=True)
        ok = ok and bool(result["bit_identical"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
