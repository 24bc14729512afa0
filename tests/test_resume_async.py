"""Work in flight under ``trainer.async_mode``: SIGKILL of the driver, then resume; and a killed
rollout worker.

Each run is a subprocess with its own local Ray (its process group is killed, workers
included). The rollout has a pool of its own and generates ahead of the trainer
(``one_step_off``: one batch; ``fully_async`` with ``max_staleness = 2``: two), so every
checkpoint is written with generations queued, and saves them (``async_queue/``). The driver
is SIGKILLed right after a checkpoint at a random step, the same command resumes and finishes:
its exported final weights must be ``torch.equal`` to an unbroken run's, its resumed step must
train the queued rows (their staleness, not 0), and the samples each step trained
(``trainer.rollout_data_dir``, one file per step, rewritten when a step is trained again) must
be exactly the data order: 8 prompts unshuffled, 2 per step, 5 steps (an epoch boundary inside
the queue), every prompt trained once per epoch, none lost, none twice.

Killing the rollout pool's worker process with ``trainer.max_worker_restarts = 0`` stops the
run with one ``error:`` line naming the pool (tests/test_recovery.py: it is replaced).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOTAL_STEPS = 5  # 8 prompts, 2 per step: one epoch and the first step of the next
BATCH = 2
N = 2
VARIED_REWARD = Path(__file__).parent / "data" / "varied-reward"
EXPECTED = [[(2 * s + i) % 8 for i in range(BATCH)] for s in range(TOTAL_STEPS)]

MODES = {
    "one_step_off": 'async_mode = "one_step_off"',
    "fully_async": 'async_mode = "fully_async"\nmax_staleness = 2',
}

PLACE_ROLLOUT = """placement = { rollout = "gen" }
[resources.pools.gen]
processes_per_node = 1
cpus_per_process = 0.5
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import (
        arithmetic_rows,
        tiny_run_model,
        write_jsonl,
        write_train_script,
    )

    root = tmp_path_factory.mktemp("resume_async")
    model = tiny_run_model(root / "model")
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), root / "train.jsonl")
    return model, train, write_train_script(root / "runner.py")


def _write_config(assets, run_dir: Path, mode: str, restarts: int | None = None) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    model, train, _ = assets
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=run_dir,
        train_batch_size=BATCH,
        n=N,
        total_steps=TOTAL_STEPS,
        save_freq=1,
        seed=7,
        cpus_per_process=0.5,
        rewards=("parity",),  # the random tiny model never answers right: no update otherwise
        extra=PLACE_ROLLOUT,
    )
    text = text.replace("[data]\n", "[data]\nshuffle = false\n", 1)
    dump = json.dumps(str(run_dir / "samples"))
    text = text.replace("[trainer]\n", f"[trainer]\n{MODES[mode]}\nrollout_data_dir = {dump}\n", 1)
    if restarts is not None:
        text = text.replace("[trainer]\n", f"[trainer]\nmax_worker_restarts = {restarts}\n", 1)
    path = run_dir.parent / f"{run_dir.name}.toml"
    path.write_text(text)
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["OMP_NUM_THREADS"] = "1"
    # The test reward's distribution, found by the driver, its reward pool and the workers.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VARIED_REWARD), env.get("PYTHONPATH")]))
    return env


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,  # its own process group: Ray's processes die with it
    )


def _latest(run_dir: Path) -> str | None:
    try:
        return (run_dir / "checkpoints" / "latest").read_text().strip()
    except FileNotFoundError:
        return None


def _wait_for(proc: subprocess.Popen, run_dir: Path, target: str, log: Path) -> None:
    deadline = time.monotonic() + 180
    while _latest(run_dir) != target:
        assert proc.poll() is None, f"run ended before {target}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {target} within 180 s"
        time.sleep(0.02)


def _killpg(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted((run_dir / "final_hf").glob("*.safetensors"))
    assert files, f"no exported safetensors in {run_dir / 'final_hf'}"
    out: dict = {}
    for file in files:
        out |= load_file(file)
    return out


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sigkill_with_generations_in_flight_then_resume_is_bit_identical(assets, tmp_path, mode):
    import torch

    runner = assets[2]
    # Reference: one unbroken run.
    ref_dir = tmp_path / "ref"
    ref_log = tmp_path / "ref.log"
    proc = _start([sys.executable, str(runner), str(_write_config(assets, ref_dir, mode))], ref_log)
    try:
        assert proc.wait(timeout=240) == 0, ref_log.read_text()[-4000:]
    finally:
        _killpg(proc)

    run_dir = tmp_path / "run"
    config = _write_config(assets, run_dir, mode)
    log = tmp_path / "run.log"
    step = random.choice((1, 2, 3))
    proc = _start([sys.executable, str(runner), str(config)], log)
    try:
        _wait_for(proc, run_dir, f"global_step_{step}", log)
    finally:
        _killpg(proc)
    assert proc.returncode == -signal.SIGKILL
    assert _latest(run_dir) == f"global_step_{step}", f"killed too late: {_latest(run_dir)}"
    # The checkpoint was written with generations queued (the work in flight), and saved them.
    first = _metrics(run_dir)
    depth = {r["step"]: r["async/queue_depth"] for r in first if "async/queue_depth" in r}
    assert depth[step] >= 1, depth
    saved = run_dir / "checkpoints" / f"global_step_{step}" / "async_queue"
    assert len(list(saved.glob("batch_*.pt"))) == depth[step], sorted(saved.iterdir())

    proc = _start([sys.executable, str(runner), str(config)], log)
    try:
        rc = proc.wait(timeout=240)
    finally:
        _killpg(proc)
    assert rc == 0, log.read_text()[-4000:]
    assert f"global_step_{step}" in log.read_text()  # it did resume from the kill's step

    trained = {
        int(f.stem): [json.loads(x) for x in f.read_text().splitlines()]
        for f in (run_dir / "samples").glob("*.jsonl")
    }
    assert sorted(trained) == list(range(1, TOTAL_STEPS + 1))
    got = [sorted({r["index"] for r in trained[s]}) for s in sorted(trained)]
    assert got == EXPECTED, f"killed after step {step}: trained {got}, data order {EXPECTED}"
    for s, rows in trained.items():
        assert len(rows) == BATCH * N, (s, rows)
    # The step right after the resume trained the saved generations (sampled with the older
    # weights, as in the unbroken run), not new ones from the restored weights.
    ref_rows = {r["step"]: r for r in _metrics(ref_dir) if "training/staleness" in r}
    resumed = [r for r in _metrics(run_dir) if r["step"] == step + 1 and "training/staleness" in r]
    assert resumed[-1]["training/staleness"] == ref_rows[step + 1]["training/staleness"] > 0
    ref, out = _weights(ref_dir), _weights(run_dir)
    assert ref.keys() == out.keys()
    for key in ref:
        assert torch.equal(ref[key], out[key]), f"{key} differs after the resume at step {step}"
    from safetensors.torch import load_file

    base = load_file(next(Path(assets[0]).glob("*.safetensors")))
    assert any(not torch.equal(base[k], ref[k]) for k in base if k in ref)  # it did train
    print(f"\n{mode}: killed after step {step}; queue depth then {depth[step]:g}; trained {got}")


def test_a_killed_rollout_worker_stops_the_run_naming_its_pool(assets, tmp_path):
    run_dir = tmp_path / "run"
    config = _write_config(assets, run_dir, "fully_async", restarts=0)  # no replacement
    log = tmp_path / "run.log"
    proc = _start([sys.executable, "-m", "rlcore.cli", "train", str(config)], log)
    try:
        _wait_for(proc, run_dir, "global_step_1", log)
        victims = [p for p in _session(proc.pid) if _cmdline(p).startswith("ray::RolloutWorker")]
        assert len(victims) == 1, [(p, _cmdline(p)) for p in _session(proc.pid)]
        os.kill(victims[0], signal.SIGKILL)
        code = proc.wait(timeout=90)
    finally:
        _killpg(proc)
    out = log.read_text()
    assert code == 2, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, out[-3000:]
    assert re.match(
        rf"error: role rollout on pool 'gen' rank 0 \(node [\d.]+, pid {victims[0]}\) died in "
        r"\w+: exit SYSTEM_ERROR",
        errors[0],
    ), errors[0]


def _session(sid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
