"""Kill the driver with SIGKILL right after a checkpoint, resume with ``resume = "auto"``.

Each run is a subprocess with its own local Ray (its process group is killed, workers
included), 4 steps of 2 batches per epoch, a checkpoint every step; its exported final actor
must be bit-identical to an uninterrupted run's. One case per algorithm whose step carries
something a resume must restore:

- PPO (actor + critic; GAE against an untrained critic gives non-zero gradients): killed once
  mid-epoch and once at an epoch boundary, in a random order of the two plans;
- DAPO: dynamic sampling pulls extra prompts from the loader inside a step (its position,
  mid-step, is what a resume must get right); killed once at a random step. The random tiny
  model never answers right, so these runs score with ``parity`` (tests/data/varied-reward),
  a deterministic test reward that splits random text and leaves groups to keep and drop;
- ReMax: a greedy generation per prompt is the baseline (``parity`` too, so advantages are
  not all zero); killed once at a random step;
- on-policy distillation: a frozen teacher role (the tiny model with a sharper output layer,
  so the reverse KL is not 0); killed once at a random step.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOTAL_STEPS = 4  # 2 epochs of 2 batches
VARIED_REWARD = Path(__file__).parent / "data" / "varied-reward"


@dataclass(frozen=True)
class Case:
    algorithm: str
    kill_plans: tuple[tuple[int, ...], ...]  # one is drawn: the steps to kill after, in order
    options: str = ""
    rewards: tuple[str, ...] = ("gsm8k",)
    critic_lr: float | None = None
    teacher: bool = False  # a [roles.teacher]: the assets' teacher model


CASES = {
    "ppo": Case(algorithm="ppo", kill_plans=((1, 2), (2, 3)), critic_lr=1e-3),
    "dapo": Case(
        algorithm="dapo",
        kill_plans=((1,), (2,), (3,)),
        options='filter_groups = { metric = "acc" }',
        rewards=("parity",),
    ),
    # ReMax: a greedy generation per prompt inside the step (its baseline); greedy or not,
    # the rollout's sampling RNG must stand where the uninterrupted run's did.
    "remax": Case(algorithm="remax", kill_plans=((1,), (2,), (3,)), rewards=("parity",)),
    # On-policy distillation: a frozen teacher role, checkpointed in its own folder; its
    # log-probs set the advantages, so a resume that reloaded another teacher would diverge.
    "distill": Case(algorithm="distill", kill_plans=((1,), (2,), (3,)), teacher=True),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import (
        arithmetic_rows,
        tiny_run_model,
        write_jsonl,
        write_train_script,
    )

    root = tmp_path_factory.mktemp("resume")
    model = tiny_run_model(root / "model")
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), root / "train.jsonl")
    return model, train, write_train_script(root / "runner.py"), _teacher(root / "teacher")


def _teacher(path: Path) -> Path:
    """The tiny model with its output layer scaled by 3: a sharper, different distribution."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing.runs import tiny_run_model

    tiny_run_model(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(path, safe_serialization=True)
    return path


def _write_config(assets, case: Case, run_dir: Path, keep_last: int | None = None) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    model, train, _, teacher = assets
    roles = f'[roles.teacher]\nmodel = {{ path = "{teacher}" }}\n' if case.teacher else ""
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=run_dir,
        algorithm=case.algorithm,
        algorithm_options=case.options,
        rewards=case.rewards,
        critic_lr=case.critic_lr,
        total_steps=TOTAL_STEPS,
        save_freq=1,
        keep_last=keep_last or None,
        seed=7,
        extra=roles,
    )
    path = run_dir.parent / f"{run_dir.name}.toml"
    path.write_text(text)
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["OMP_NUM_THREADS"] = "1"
    # The test reward's distribution, found by the driver, its reward pool and the workers.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(VARIED_REWARD), env.get("PYTHONPATH")]))
    return env


def _start(assets, config: Path, log: Path) -> subprocess.Popen:
    _, _, runner, _ = assets
    return subprocess.Popen(
        [sys.executable, str(runner), str(config)],
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


def _run_and_kill_after(assets, config: Path, run_dir: Path, step: int, log: Path) -> None:
    """Start a run and SIGKILL its whole process group once ``latest`` names ``step``."""
    proc = _start(assets, config, log)
    target = f"global_step_{step}"
    deadline = time.monotonic() + 120
    try:
        while _latest(run_dir) != target:
            assert proc.poll() is None, f"run ended before step {step}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # The kill landed before the next checkpoint: this really is a resume from ``step``.
    assert _latest(run_dir) == target, f"killed too late: latest is {_latest(run_dir)}"


def _run_to_end(assets, config: Path, log: Path) -> None:
    proc = _start(assets, config, log)
    try:
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 0, log.read_text()[-4000:]


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted((run_dir / "final_hf").glob("*.safetensors"))
    assert files, f"no exported safetensors in {run_dir / 'final_hf'}"
    out: dict = {}
    for file in files:
        out |= load_file(file)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_sigkill_then_resume_is_bit_identical(assets, tmp_path, name):
    import torch

    case = CASES[name]
    # Reference: one uninterrupted run.
    ref_dir = tmp_path / "ref"
    _run_to_end(assets, _write_config(assets, case, ref_dir), tmp_path / "ref.log")

    plan = random.choice(case.kill_plans)
    run_dir = tmp_path / "killed"
    config = _write_config(assets, case, run_dir, keep_last=2)
    log = tmp_path / "killed.log"
    for step in plan:
        _run_and_kill_after(assets, config, run_dir, step, log)
    _run_to_end(assets, config, log)

    ref, got = _weights(ref_dir), _weights(run_dir)
    assert ref.keys() == got.keys()
    for key in ref:
        assert torch.equal(ref[key], got[key]), f"{key} differs after resume (plan {plan})"
    # The run did change the weights (a no-op run would be trivially identical).
    from safetensors.torch import load_file

    base = load_file(next(Path(assets[0]).glob("*.safetensors")))
    assert any(not torch.equal(base[n], ref[n]) for n in base if n in ref)

    # Every step was trained and logged, none twice past the resume; the resumed run
    # appended to metrics.jsonl; keep_last = 2 pruned the older checkpoints.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert sorted(set(steps)) == list(range(1, TOTAL_STEPS + 1)), steps
    assert steps[-1] == TOTAL_STEPS
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("global_step_*"))
    assert kept == [f"global_step_{TOTAL_STEPS - 1}", f"global_step_{TOTAL_STEPS}"]
    assert _latest(run_dir) == f"global_step_{TOTAL_STEPS}"
    step_dir = run_dir / "checkpoints" / f"global_step_{TOTAL_STEPS}"
    for file in ("COMPLETE", "config.toml", "trainer_state.json", "rng_state.pt"):
        assert (step_dir / file).is_file(), file
    assert (step_dir / "actor").is_dir()
    assert (step_dir / "critic").is_dir() == (case.critic_lr is not None)
    assert (step_dir / "teacher").is_dir() == case.teacher
    state = json.loads((step_dir / "trainer_state.json").read_text())
    assert state["step"] == TOTAL_STEPS
    if name == "ppo":
        # After 4 batches of 2 per epoch the loader stands at the start of epoch 2.
        assert state["dataloader"] == {"epoch": 2, "position": 0, "seed": 0}
    if name == "dapo":
        # The filter dropped groups and pulled more prompts: the resume restored a loader
        # that had moved inside steps, and the resumed run logged the same rounds.
        ref_rows = [json.loads(x) for x in (ref_dir / "metrics.jsonl").read_text().splitlines()]
        rounds = {
            r["step"]: r["train/num_gen_batches"] for r in ref_rows if "train/num_gen_batches" in r
        }
        assert max(rounds.values()) > 1, rounds
        got_rounds = {
            r["step"]: r["train/num_gen_batches"] for r in rows if "train/num_gen_batches" in r
        }
        assert got_rounds == rounds
