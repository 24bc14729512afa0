"""Runs that survive their workers (rlcore.trainer.recovery), faults injected with
rlcore.testing.faults: real signals to real worker processes, in the tests' one Ray session.

- colocated sync: SIGKILL of the rollout mid-generation and of the actor mid-update (one
  process holds both): the same ``run_training`` restarts the workers from the newest
  checkpoint, redoes the steps since, and its final weights are ``torch.equal`` to an unbroken
  run's; every prompt trained once in the final history (``trainer.rollout_data_dir``);
- the rollout on its own pool: SIGKILL under ``fully_async`` and SIGSTOP under
  ``one_step_off``: the rollout group is replaced in place, nothing is redone or lost;
- past ``trainer.max_worker_restarts``: the lost worker's line with the count, the last
  checkpoint intact.

4 steps of 4 prompts x 2 samples (one epoch of 16 prompts, unshuffled).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _fault_runs import fault_assets, fault_config

pytestmark = pytest.mark.slow

STEPS, PROMPTS, N = 4, 16, 2
PLACE_ROLLOUT = """placement = { rollout = "gen" }
[resources.pools.gen]
processes_per_node = 1
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return fault_assets(tmp_path_factory.mktemp("recovery"))


def _config(assets, run: Path, trainer: str = "", extra: str = "", save_freq: int = 2):
    return fault_config(
        assets, run, trainer=trainer, total_steps=STEPS, save_freq=save_freq, n=N, extra=extra
    )


def _train(config, monkeypatch, *faults) -> int:
    from rlcore.testing.faults import FAULTS_ENV, fault_env
    from rlcore.trainer import run_training

    monkeypatch.setenv(FAULTS_ENV, fault_env(*faults))
    return run_training(config)


def _last_metrics(run: Path) -> dict:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "fault/worker_restarts" in r][-1]


def _audit(run: Path) -> None:
    """The samples the final weights were trained on: each prompt once in the epoch."""
    files = sorted((run / "samples").glob("*.jsonl"), key=lambda f: int(f.stem))
    assert [int(f.stem) for f in files] == list(range(1, STEPS + 1))
    indices = [json.loads(x)["index"] for f in files for x in f.read_text().splitlines()]
    assert sorted(indices) == sorted(list(range(PROMPTS)) * N)


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for file in sorted((run / "final_hf").glob("*.safetensors")):
        out |= load_file(file)
    assert out, f"no export in {run}"
    return out


@pytest.fixture(scope="module")
def unbroken(ray_session, assets, tmp_path_factory):
    from rlcore.trainer import run_training

    run = tmp_path_factory.mktemp("unbroken") / "run"
    assert run_training(_config(assets, run)) == 0
    return run


@pytest.mark.parametrize(
    ("role", "phase"),
    [("rollout", "gen"), ("actor", "update_actor")],
)
def test_a_killed_colocated_worker_is_recovered_from_the_checkpoint_bit_for_bit(
    ray_session, assets, unbroken, tmp_path, monkeypatch, role, phase
):
    import torch

    from rlcore.testing.faults import Fault

    run = tmp_path / "run"
    # Step 4 dies: the newest checkpoint is step 2, so step 3 is trained again.
    fault = Fault(action="kill", role=role, phase=phase, step=4, delay_s=0.0)
    assert _train(_config(assets, run), monkeypatch, fault) == 0
    last = _last_metrics(run)
    assert last["fault/worker_restarts"] == 1.0
    assert last["fault/redone_steps"] == 1.0
    assert last["fault/lost_samples"] == 0.0
    _audit(run)
    assert sorted(p.name for p in (run / "samples" / "abandoned" / "1").iterdir()) == ["3.jsonl"]
    # Colocated synchronous runs are deterministic: the recovered run is the unbroken one.
    got, want = _weights(run), _weights(unbroken)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [
        k for k in want if not torch.equal(got[k], want[k])
    ]


@pytest.mark.parametrize(
    ("mode", "action", "steps"),
    [
        # step 1 generates in the step (a call that dies), step 3 takes a queued batch
        ("fully_async", "kill", (1, 3)),
        ("one_step_off", "stop", (3,)),
    ],
)
def test_a_lost_rollout_on_its_own_pool_is_replaced_in_place(
    ray_session, assets, tmp_path, monkeypatch, mode, action, steps
):
    from rlcore.testing.faults import Fault

    run = tmp_path / "run"
    trainer = f'async_mode = "{mode}"' + ("\nmax_staleness = 2" if mode == "fully_async" else "")
    extra = PLACE_ROLLOUT.replace("[resources.pools", "heartbeat_timeout_s = 4\n[resources.pools")
    config = _config(assets, run, trainer=trainer, extra=extra)
    faults = [Fault(action=action, role="rollout", phase="gen", step=s, delay_s=0.0) for s in steps]
    # A straggler that comes back within the heartbeat bound is waited for, not replaced.
    faults.append(Fault(action="slow", role="rollout", phase="gen", step=2, slow_s=1.0))
    assert _train(config, monkeypatch, *faults) == 0
    last = _last_metrics(run)
    assert last["fault/worker_restarts"] == len(steps)
    assert last["fault/redone_steps"] == 0.0  # in place: no step trained again
    assert last["fault/lost_samples"] == 0.0
    _audit(run)
    assert not (run / "samples" / "abandoned").exists()


def test_a_killed_trainer_beside_a_rollout_pool_recovers_from_the_checkpoint(
    ray_session, assets, tmp_path, monkeypatch
):
    from rlcore.testing.faults import Fault

    run = tmp_path / "run"
    config = _config(
        assets, run, trainer='async_mode = "fully_async"\nmax_staleness = 2', extra=PLACE_ROLLOUT
    )
    fault = Fault(action="kill", role="actor", phase="update_actor", step=4, delay_s=0.0)
    assert _train(config, monkeypatch, fault) == 0
    last = _last_metrics(run)
    assert last["fault/worker_restarts"] == 1.0
    assert last["fault/redone_steps"] == 1.0  # step 3, after the checkpoint of step 2
    assert last["fault/lost_samples"] == 0.0
    _audit(run)


def test_past_max_worker_restarts_the_run_stops_with_the_workers_line(
    ray_session, assets, tmp_path, monkeypatch
):
    from rlcore.checkpoint import CHECKPOINTS_DIR, CheckpointManager
    from rlcore.errors import WorkerLostError
    from rlcore.testing.faults import Fault

    run = tmp_path / "run"
    config = _config(assets, run, trainer="max_worker_restarts = 1", save_freq=1)
    kills = [
        Fault(action="kill", role="actor", phase="update_actor", step=2, delay_s=0.0),
        Fault(action="kill", role="actor", phase="update_actor", step=3, delay_s=0.0),
    ]
    with pytest.raises(WorkerLostError) as caught:
        _train(config, monkeypatch, *kills)
    line = str(caught.value).splitlines()[0]
    assert line.startswith("role rlcore.actor_rollout_ref rank 0 (node "), line
    assert "died in update_actor: " in line
    assert line.endswith(
        "(after 1 worker restart(s); trainer.max_worker_restarts = 1); the last checkpoint "
        "is intact"
    ), line
    latest = CheckpointManager(run / CHECKPOINTS_DIR).latest()
    assert latest is not None
    assert latest.name == "global_step_2"


def test_the_restart_budget_adds_its_count_once():
    """A lost worker's line past the budget, raised where it was spent (a rollout replaced in
    place) and passing the run's recovery on its way up, carries the count once."""
    from rlcore.errors import WorkerLostError
    from rlcore.trainer.recovery import Recovery, RestartsExhaustedError

    recovery = Recovery(1)
    lost = WorkerLostError("role rollout rank 0 (pid 7) died in generate_sequences: exit\nmore")
    recovery.spend(lost)
    assert recovery.metrics()["fault/worker_restarts"] == 1.0
    with pytest.raises(RestartsExhaustedError) as first:
        recovery.spend(lost)
    with pytest.raises(RestartsExhaustedError) as again:
        recovery.spend(first.value)
    assert again.value is first.value
    assert str(first.value).splitlines() == [
        "role rollout rank 0 (pid 7) died in generate_sequences: exit (after 1 worker "
        "restart(s); trainer.max_worker_restarts = 1); the last checkpoint is intact",
        "more",
    ]
