"""How ``rlcore train`` stops: SIGTERM, a second run on the same directory, a reward calling
``sys.exit``, an update that diverges. Each a real run in its own session (see
``test_faults_cli.py`` for the kill and Ctrl-C cases).

- SIGTERM to the driver (``kill PID``), or to the whole process group (``kill -TERM -PGID``,
  what Slurm and Kubernetes send), behaves like Ctrl-C: the step in flight is finished and
  saved, one ``interrupted:`` line, exit 143;
- a second ``rlcore train`` on a run directory in use fails at once with one line;
- a ``checkpoints/`` folder that stops taking writes mid-run: one line naming it, exit 2,
  the checkpoints saved before intact;
- a reward that calls ``sys.exit(3)`` costs that sample (scored 0 as an error, one warning);
  the run goes on and its checkpoints are kept;
- ``actor.optim.lr = 1e30``: the divergence guard stops before saving the diverged weights.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
EXIT_REWARD = HERE / "data" / "exit-reward"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("stops")
    model = tiny_run_model(root / "model")
    pairs = [(a, b) for a in range(4) for b in range(4)]
    return model, write_jsonl(arithmetic_rows(pairs), root / "train.jsonl")


def _config(assets, tmp_path: Path, *, steps: int = 200, lr: float = 1e-3) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    model, data = assets
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        tiny_run_toml(
            model=model,
            train_files=[data],
            run_dir=tmp_path / "run",
            micro_batch_size=4,
            total_steps=steps,
            save_freq=1,
            lr=lr,
            experiment_name="stops",
        )
    )
    return cfg


def _train(cfg: Path, log: Path, *overrides: str, **env: str) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    environ |= {"OMP_NUM_THREADS": "1", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "train", str(cfg), *overrides],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=environ,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 240) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path}:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def _lines(out: str, prefix: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(prefix)]


def _session_alive(sid: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                alive.append(int(entry))
    return alive


def _assert_nothing_left(sid: int) -> None:
    deadline = time.monotonic() + 15
    while left := _session_alive(sid):
        assert time.monotonic() < deadline, f"processes of the run remain: {left}"
        time.sleep(0.2)


def test_sigterm_saves_the_step_and_exits_143_and_a_second_run_is_refused(assets, tmp_path):
    cfg = _config(assets, tmp_path)
    log = tmp_path / "train.log"
    proc = _train(cfg, log)
    try:
        _wait_for(tmp_path / "run" / "checkpoints" / "latest", proc, log)

        # A second run on the same directory: refused at once, before Ray starts.
        log2 = tmp_path / "second.log"
        start = time.monotonic()
        second = _train(cfg, log2)
        code2 = _finish(second, timeout=120)
        took = time.monotonic() - start
        out2 = log2.read_text()
        assert code2 == 2, out2[-3000:]
        assert re.fullmatch(
            rf"error: trainer\.run_dir: {re.escape(str(tmp_path / 'run'))} is in use by another "
            rf"rlcore train \(pid {proc.pid}, since [\d :-]+\); wait for it to finish or set "
            r"another trainer\.run_dir",
            "\n".join(_lines(out2, "error: ")),
        ), out2[-3000:]
        assert "Traceback" not in out2
        print(f"second run refused after {took:.1f} s (contended machine)")

        os.kill(proc.pid, signal.SIGTERM)  # the driver only, as Kubernetes and `kill` do
        sent = time.monotonic()
        code = _finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    print(f"SIGTERM: exit {code} after {time.monotonic() - sent:.1f} s")
    assert code == 143, out[-3000:]
    lines = _lines(out, "interrupted")
    assert len(lines) == 1, out[-3000:]
    saved = re.match(r"interrupted: last checkpoint is step (\d+) ", lines[0])
    assert saved, lines
    logged = [
        json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert int(saved.group(1)) == max(row["step"] for row in logged)  # the step in flight, saved
    assert "Traceback" not in out
    _assert_nothing_left(proc.pid)


def _blocks_sigterm(pid: int) -> bool:
    """SIGTERM blocked or ignored in ``pid`` (multiprocessing's resource tracker ignores it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # gone meanwhile
    masks = dict(ln.split(":\t", 1) for ln in status.splitlines() if ln.startswith("Sig"))
    bit = 1 << (signal.SIGTERM - 1)
    return bool((int(masks["SigBlk"], 16) | int(masks["SigIgn"], 16)) & bit)


def test_sigterm_to_the_process_group_is_handled_like_ctrl_c(assets, tmp_path):
    """``kill -TERM -PGID``, what Slurm (scancel, the time limit) and Kubernetes send: Ray's
    processes and the reward pool, in the same group, have SIGTERM blocked, so only the driver
    acts on it: the step in flight is saved, one line, exit 143, no Ray crash dump."""
    cfg = _config(assets, tmp_path)
    log = tmp_path / "train.log"
    proc = _train(cfg, log)
    try:
        _wait_for(tmp_path / "run" / "checkpoints" / "latest", proc, log)
        others = [p for p in _session_alive(proc.pid) if p != proc.pid]
        assert others, "no Ray processes found in the run's session"
        unshielded = [p for p in others if not _blocks_sigterm(p)]
        assert not unshielded, [Path(f"/proc/{p}/cmdline").read_bytes() for p in unshielded]
        os.killpg(proc.pid, signal.SIGTERM)  # the group: driver, GCS, raylet, workers, pool
        sent = time.monotonic()
        code = _finish(proc, timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    print(f"SIGTERM to the group: exit {code} after {took:.1f} s (contended machine)")
    assert code == 143, out[-3000:]
    lines = _lines(out, "interrupted")
    assert len(lines) == 1, out[-3000:]
    saved = re.match(r"interrupted: last checkpoint is step (\d+) ", lines[0])
    assert saved, lines
    logged = [
        json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert int(saved.group(1)) == max(row["step"] for row in logged)  # the step in flight, saved
    for crash in ("Traceback", "SIGTERM", "RayActorError", "ActorDiedError", "error: "):
        assert crash not in out, out[-3000:]
    from rlcore.checkpoint.safe_load import verify_checkpoint

    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert verify_checkpoint(tmp_path / "run" / "checkpoints" / latest) is None
    _assert_nothing_left(proc.pid)


def test_a_checkpoints_folder_that_stops_taking_writes_is_one_line(assets, tmp_path):
    """``checkpoints/`` made unwritable while the run trains (a full or remounted disk, a
    chmod): the next save fails with one line naming the folder, exit 2; every checkpoint
    saved before is intact and ``latest`` still names the newest."""
    sys.path.insert(0, str(HERE))
    from _bad_inputs import unwritable

    cfg = _config(assets, tmp_path)
    log = tmp_path / "train.log"
    proc = _train(cfg, log)
    checkpoints = tmp_path / "run" / "checkpoints"
    try:
        _wait_for(checkpoints / "latest", proc, log)
        with unwritable(checkpoints):
            blocked = time.monotonic()
            code = _finish(proc, timeout=120)
            took = time.monotonic() - blocked
            before = sorted(p.name for p in checkpoints.glob("global_step_*"))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    print(f"unwritable checkpoints/: exit {code} after {took:.1f} s (contended machine)")
    assert code == 2, out[-3000:]
    errors = _lines(out, "error: ")
    assert len(errors) == 1, out[-3000:]
    reason = "Permission denied" if os.geteuid() != 0 else "Operation not permitted"
    latest = (checkpoints / "latest").read_text().strip()
    assert re.fullmatch(
        rf"error: cannot save checkpoint step (\d+) in {re.escape(str(checkpoints))}: "
        rf"{re.escape(str(checkpoints))}/\.tmp-global_step_\d+: {reason}; make the folder "
        rf"writable \(or free space\) and rerun to resume; the last saved checkpoint, "
        rf"{latest}, is intact",
        errors[0],
    ), errors
    assert "Traceback" not in out
    from rlcore.checkpoint.safe_load import verify_checkpoint

    steps = sorted(int(name.rsplit("_", 1)[1]) for name in before)
    assert latest == f"global_step_{steps[-1]}", (before, latest)  # the newest, still named
    for name in before:
        assert verify_checkpoint(checkpoints / name) is None, name
    # When the folder turned read-only after this save made its temporary folder, the save
    # fails at the final rename and can empty that folder but not unlink it from the read-only
    # parent; the next save removes it (CheckpointManager._remove_leftovers) and resume never
    # reads a ".tmp-" folder. Either way nothing of the failed save is left in it.
    for tmp in checkpoints.glob(".tmp-*"):
        assert not any(tmp.iterdir()), sorted(tmp.rglob("*"))
    _assert_nothing_left(proc.pid)


def test_a_reward_calling_sys_exit_is_counted_and_the_checkpoint_kept(assets, tmp_path):
    """Rewards are scored in the reward pool: ``sys.exit`` there kills one pool worker, which is
    replaced; the sample scores 0 as an error, named in one warning, and the run goes on (here
    it is then stopped with SIGTERM). In-driver scoring gets one ``error:`` line instead (see
    ``test_a_system_exit_during_training_is_one_line`` in test_bad_inputs_runtime.py)."""
    cfg = _config(assets, tmp_path)
    log = tmp_path / "train.log"
    marker = tmp_path / "exit-now"
    path = os.pathsep.join(filter(None, [str(EXIT_REWARD), os.environ.get("PYTHONPATH")]))
    proc = _train(
        cfg,
        log,
        'reward.default=["exit_reward"]',
        PYTHONPATH=path,
        RLCORE_TEST_EXIT_MARKER=str(marker),
    )
    pattern = re.compile(
        r"reward: \d+ timeouts, \d+ errors in \d+ calls; first: reward 'exit_reward': its "
        r"worker died \(exit code 3\)"
    )
    try:
        _wait_for(tmp_path / "run" / "checkpoints" / "latest", proc, log)
        marker.touch()
        deadline = time.monotonic() + 180
        while not pattern.search(log.read_text()):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        code = _finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    assert code == 143, out[-3000:]
    assert "Traceback" not in out
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    from rlcore.checkpoint.safe_load import verify_checkpoint

    assert verify_checkpoint(tmp_path / "run" / "checkpoints" / latest) is None
    _assert_nothing_left(proc.pid)


def test_a_diverged_update_is_never_saved(assets, tmp_path):
    cfg = _config(assets, tmp_path, steps=2, lr=1e30)
    log = tmp_path / "train.log"
    # Varied rewards, so the update is not zero (the GSM8K reward scores a random model 0).
    path = os.pathsep.join(filter(None, [str(EXIT_REWARD), os.environ.get("PYTHONPATH")]))
    proc = _train(cfg, log, 'reward.default=["exit_reward"]', PYTHONPATH=path)
    code = _finish(proc)
    out = log.read_text()
    assert code == 2, out[-3000:]
    errors = _lines(out, "error: ")
    assert len(errors) == 1, out[-3000:]
    assert re.fullmatch(
        r"error: step 1: after the update the actor's log-probabilities are not finite \(\d+ of "
        r"\d+ response tokens\): its weights diverged; stopping without saving it; lower "
        r"actor\.optim\.lr \(or critic\.optim\.lr\) or set actor\.grad_clip, then resume from "
        r"the last checkpoint",
        errors[0],
    ), errors
    assert not (tmp_path / "run" / "checkpoints" / "latest").exists()
    assert not list((tmp_path / "run" / "checkpoints").glob("global_step_*"))
    _assert_nothing_left(proc.pid)
