"""Elastic rollout capacity (rlcore.trainer.elastic, SplitPolicy's replicas): ``rlcore scale
RUN_DIR rollout=N`` against a running fully-async run, in the tests' one Ray session.

- 1 -> 2 -> 1 replicas mid-run: ``fault/rollout_replicas`` goes 1, 2, 1 and every prompt is
  trained exactly once per epoch (audited from ``trainer.rollout_data_dir``);
- a replica killed (rlcore.testing.faults) while two run: the fleet shrinks to one, no
  restart spent, nothing lost; a request that cannot be placed leaves the fleet as it is;
- bad input to ``rlcore scale``: one line each.

8 steps of 4 prompts x 2 samples (two epochs of 16 prompts, unshuffled), max_staleness 2.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from _fault_runs import fault_assets, fault_config

STEPS, PROMPTS, N, PER_STEP = 8, 16, 2, 4
ASYNC = 'async_mode = "fully_async"\nmax_staleness = 2'
PLACE_ROLLOUT = """placement = { rollout = "gen" }
heartbeat_timeout_s = 4
[resources.pools.gen]
processes_per_node = 1
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return fault_assets(tmp_path_factory.mktemp("elastic"))


def _config(assets, run: Path, trainer: str = ASYNC, extra: str = PLACE_ROLLOUT):
    return fault_config(
        assets, run, trainer=trainer, total_steps=STEPS, train_batch_size=PER_STEP, n=N, extra=extra
    )


def _scale(run: Path, count: int) -> None:
    from rlcore.cli import main

    assert main(["scale", str(run), f"rollout={count}"]) == 0


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "fault/rollout_replicas" in r]


def _audit(run: Path) -> None:
    """Each prompt trained once per epoch (steps 1-4, 5-8), within the staleness bound."""
    files = sorted((run / "samples").glob("*.jsonl"), key=lambda f: int(f.stem))
    assert [int(f.stem) for f in files] == list(range(1, STEPS + 1))
    per_epoch = PROMPTS // PER_STEP
    for epoch in range(STEPS // per_epoch):
        chunk = files[epoch * per_epoch : (epoch + 1) * per_epoch]
        rows = [json.loads(x) for f in chunk for x in f.read_text().splitlines()]
        assert sorted(r["index"] for r in rows) == sorted(list(range(PROMPTS)) * N), epoch
        for r in rows:  # trained at version step-1, sampled at most 2 versions before
            assert r["step"] - 1 - r["weight_version"] <= 2, r


def _after(run: Path, step: int, action, timeout_s: float = 300.0) -> threading.Thread:
    """Run ``action`` once step ``step``'s samples are written (the run goes on meanwhile)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not (run / "samples" / f"{step}.jsonl").exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_scaling_one_two_one_replicas_loses_and_repeats_no_sample(ray_session, assets, tmp_path):
    from rlcore.trainer import run_training

    run = tmp_path / "run"
    config = _config(assets, run)
    # Applied at the start of step 3 or 4, and the drain at step 5 or 6 (after step 4's
    # samples the second replica is there: it was asked for before step 4 started).
    up = _after(run, 2, lambda: _scale(run, 2))
    down = _after(run, 4, lambda: _scale(run, 1))
    assert run_training(config) == 0
    up.join(1), down.join(1)
    counts = [int(r["fault/rollout_replicas"]) for r in _rows(run)]
    assert len(counts) == STEPS
    first_two, last_two = counts.index(2), len(counts) - 1 - counts[::-1].index(2)
    assert counts == [1] * first_two + [2] * (last_two - first_two + 1) + [1] * (
        STEPS - last_two - 1
    ), counts
    assert first_two in (2, 3), counts
    assert last_two in (3, 4, 5), counts
    assert all(r["fault/lost_samples"] == 0.0 for r in _rows(run))
    assert all(r["fault/worker_restarts"] == 0.0 for r in _rows(run))
    _audit(run)


@pytest.mark.slow
def test_a_lost_replica_shrinks_the_fleet_and_an_unplaceable_one_is_refused(
    ray_session, assets, tmp_path, monkeypatch, caplog
):
    from rlcore.testing.faults import FAULTS_ENV, Fault, fault_env
    from rlcore.trainer import run_training

    run = tmp_path / "run"
    config = _config(assets, run)
    run.mkdir(parents=True)
    (run / "config.toml").write_text(
        '[trainer]\nasync_mode = "fully_async"\n[resources]\nplacement = { rollout = "gen" }\n'
    )
    _scale(run, 2)  # before the run: read before step 1 (a request outlives a driver)
    # Step 1 generates on the first replica and queues batches 2 and 3, batch 3 on the
    # second replica (rollout rank 1: every replica's ranks in turn), killed right after.
    kill = Fault(action="kill", role="rollout", rank=1, phase="reward", step=1, delay_s=0)
    monkeypatch.setenv(FAULTS_ENV, fault_env(kill))
    # 9 replicas do not fit the tests' 4 CPUs: one line, the fleet stays as it is.
    _after(run, 5, lambda: _scale(run, 9))
    with caplog.at_level("WARNING", logger="rlcore.trainer.placement"):
        assert run_training(config) == 0
    rows = _rows(run)
    counts = [int(r["fault/rollout_replicas"]) for r in rows]
    assert counts[0] in (1, 2), counts  # the loss shows in step 1's sync or step 3's batch
    assert counts[1:] == [1] * (STEPS - 1) or counts[2:] == [1] * (STEPS - 2), counts
    assert all(r["fault/worker_restarts"] == 0.0 for r in rows)  # dropped, not replaced
    assert all(r["fault/lost_samples"] == 0.0 for r in rows)
    lines = [r.getMessage() for r in caplog.records]
    assert any("rollout replica lost for good, the fleet shrinks to 1" in m for m in lines)
    # the lost replica's queued batch (4 prompts x 2), generated again on the other
    assert "regenerated 8 queued prompt rows on a live rollout group" in lines, lines
    refused = [m for m in lines if m.startswith("rlcore scale: 8 more rollout replica(s)")]
    assert refused, lines
    assert "the fleet stays at 1" in refused[0], refused
    _audit(run)


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ["rollout=2"], "is not a run directory (no config.toml)"),
        ("async", ["rollout=0"], "rollout= takes a positive integer (replicas), got '0'"),
        ("async", ["rollout=two"], "rollout= takes a positive integer (replicas), got 'two'"),
        ("async", ["actor=2"], "expected rollout=N (the rollout replicas wanted), got 'actor=2'"),
        ("colocated", ["rollout=2"], "is colocated (trainer.async_mode = 'fully_async', "),
        ("sync", ["rollout=2"], "is synchronous (trainer.async_mode = 'off', "),
    ],
)
def test_scale_bad_input_is_one_line(tmp_path, capsys, setup, args, message):
    from rlcore.cli import main
    from rlcore.trainer.elastic import SCALE_FILE

    place = '[resources]\nplacement = { rollout = "gen" }\n'
    texts = {
        "async": f'[trainer]\nasync_mode = "fully_async"\n{place}',
        "colocated": '[trainer]\nasync_mode = "fully_async"\n[resources]\nplacement = {}\n',
        "sync": f'[trainer]\nasync_mode = "off"\n{place}',
    }
    if setup is not None:
        (tmp_path / "config.toml").write_text(texts[setup])
    assert main(["scale", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err, err
    if setup in ("colocated", "sync"):
        assert "resources.placement" in err
        assert "trainer.async_mode" in err
    assert not (tmp_path / SCALE_FILE).exists()


def test_a_scale_request_is_written_whole_and_read_once_per_fleet(tmp_path):
    from rlcore.trainer.elastic import SCALE_FILE, ScaleWatcher, read_request, request_scale

    (tmp_path / "config.toml").write_text(
        '[trainer]\nasync_mode = "one_step_off"\n[resources]\nplacement = { rollout = "g" }\n'
    )
    first = request_scale(tmp_path, 3)
    assert read_request(tmp_path / SCALE_FILE) == first
    assert {p.name for p in tmp_path.iterdir()} == {"config.toml", SCALE_FILE}  # no temp left

    class Fleet:  # what the watcher asks of SplitPolicy
        def __init__(self) -> None:
            self.applied_request: str | None = None
            self.replicas = [object()]
            self.asked: list[int] = []

        def scale_to(self, count: int) -> None:
            self.asked.append(count)

    fleet = Fleet()
    watcher = ScaleWatcher(tmp_path)
    watcher.poll(fleet)  # type: ignore[arg-type]
    watcher.poll(fleet)  # type: ignore[arg-type]
    assert fleet.asked == [3]
    request_scale(tmp_path, 1)
    watcher.poll(fleet)  # type: ignore[arg-type]
    assert fleet.asked == [3, 1]
    (tmp_path / SCALE_FILE).write_text("{not json")
    watcher.poll(fleet)  # type: ignore[arg-type]  # said once, nothing done
    assert fleet.asked == [3, 1]
