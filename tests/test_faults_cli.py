"""``rlcore train`` in a subprocess, with its own local Ray, under faults.

- one worker process SIGKILLed mid-step, ``trainer.max_worker_restarts = 0``: the driver exits
  non-zero within 60 s with one ``error:`` line naming role, rank, node and Ray's cause; no
  process of the run remains; the same command then resumes from the last checkpoint and
  finishes;
- Ctrl-C (SIGINT to the process group, as a terminal sends it): exit 130 with one
  ``interrupted:`` line naming the last checkpoint; no process of the run remains.

Orphans are found by session: the driver starts in a new session, and every process it or Ray
starts (raylet, GCS, workers) stays in it unless it calls ``setsid`` itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOTAL_STEPS = 4


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("faults_cli")
    model = tiny_run_model(root / "model")
    pairs = [(a, b) for a in range(4) for b in range(4)]
    return model, write_jsonl(arithmetic_rows(pairs), root / "train.jsonl")


def _write_config(assets, tmp_path: Path, processes: int) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    model, data = assets
    cfg = tmp_path / "cfg.toml"
    text = tiny_run_toml(
        model=model,
        train_files=[data],
        run_dir=tmp_path / "run",
        micro_batch_size=4,
        total_steps=TOTAL_STEPS,
        save_freq=1,
        experiment_name="faults",
        processes_per_node=processes,
        cpus_per_process=0.5,
    )
    # No restart: the killed worker stops the run (tests/test_recovery.py: it is replaced).
    cfg.write_text(text.replace("[trainer]\n", "[trainer]\nmax_worker_restarts = 0\n", 1))
    return cfg


def _start(cfg: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    # A new session: every process the run starts can be found (and must be gone) by it.
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "train", str(cfg)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


@contextlib.contextmanager
def _running(cfg: Path, log: Path) -> Iterator[subprocess.Popen]:
    """The run started by ``_start``; SIGKILLed with its session on exit if still alive."""
    proc = _start(cfg, log)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session id) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie is gone, only its exit status waits for the parent
        return None
    return int(fields[1]), int(fields[3])


def _session(sid: int) -> list[int]:
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [p for p in pids if (st := _stat(p)) is not None and st[1] == sid]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _wait_for_checkpoint(proc: subprocess.Popen, run: Path, log: Path, timeout: float = 120):
    latest = run / "checkpoints" / "latest"
    deadline = time.monotonic() + timeout
    while not latest.exists():
        assert proc.poll() is None, f"run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no checkpoint:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    return latest.read_text().strip()


def _exit(proc: subprocess.Popen, log: Path, sent: float) -> tuple[int, float, str]:
    """Wait up to 60 s for the driver to exit after a fault sent at ``sent``:
    (exit code, seconds since the fault, the log)."""
    code = proc.wait(timeout=60)
    return code, time.monotonic() - sent, log.read_text()


def _only_line(out: str, prefix: str) -> str:
    """The one line of ``out`` that starts with ``prefix`` (fails if there are 0 or 2+)."""
    lines = [ln for ln in out.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def _assert_no_orphans(sid: int, log: Path) -> None:
    deadline = time.monotonic() + 10
    while left := _session(sid):
        if time.monotonic() > deadline:
            names = "\n".join(f"{p} {_cmdline(p)[:150]}" for p in left)
            pytest.fail(f"processes of the run remain:\n{names}\n{log.read_text()[-2000:]}")
        time.sleep(0.2)


def _worker_pids(sid: int) -> list[int]:
    return [p for p in _session(sid) if _cmdline(p).startswith("ray::ColocatedWorker")]


def test_a_killed_worker_stops_the_run_within_60s_and_it_resumes(assets, tmp_path):
    cfg = _write_config(assets, tmp_path, processes=2)
    log = tmp_path / "train.log"
    with _running(cfg, log) as proc:
        first_ckpt = _wait_for_checkpoint(proc, tmp_path / "run", log)
        workers = _worker_pids(proc.pid)
        assert len(workers) == 2, [(p, _cmdline(p)) for p in _session(proc.pid)]
        victim = max(workers)  # either rank: the message must name the one that died
        os.kill(victim, signal.SIGKILL)
        code, latency, out = _exit(proc, log, sent=time.monotonic())
    print(f"killed worker pid {victim} after {first_ckpt}; driver exited {code} in {latency:.1f} s")
    assert code == 2, out[-3000:]
    error = _only_line(out, "error: ")
    assert re.match(
        rf"error: role rlcore\.\w+ rank [01] \(node [\d.]+, pid {victim}\) died in \w+: "
        r"exit SYSTEM_ERROR",
        error,
    ), error
    _assert_no_orphans(proc.pid, log)

    # The same command resumes from the last complete checkpoint and finishes the run.
    log2 = tmp_path / "resume.log"
    with _running(cfg, log2) as proc:
        code = proc.wait(timeout=180)
    out = log2.read_text()
    assert code == 0, out[-3000:]
    resumed = re.search(r"resuming from \S*global_step_(\d+)", out)
    assert resumed is not None, out[-3000:]
    assert int(resumed.group(1)) >= int(first_ckpt.removeprefix("global_step_"))
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert latest == f"global_step_{TOTAL_STEPS}"
    steps = [
        json.loads(ln)["step"]
        for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps[-1] == TOTAL_STEPS, steps
    _assert_no_orphans(proc.pid, log2)


def test_ctrl_c_exits_130_naming_the_last_checkpoint_and_leaves_nothing(assets, tmp_path):
    cfg = _write_config(assets, tmp_path, processes=1)
    log = tmp_path / "train.log"
    with _running(cfg, log) as proc:
        _wait_for_checkpoint(proc, tmp_path / "run", log)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        code, latency, out = _exit(proc, log, sent=time.monotonic())
    print(f"Ctrl-C: exit {code} after {latency:.1f} s")
    assert code == 130, out[-3000:]
    line = _only_line(out, "interrupted")
    saved = re.match(r"interrupted: last checkpoint is step (\d+) ", line)
    assert saved, line
    # The step in flight at Ctrl-C was finished and saved: nothing trained is lost.
    logged = [
        json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert int(saved.group(1)) == max(row["step"] for row in logged)
    assert "Traceback" not in out, out[-3000:]
    _assert_no_orphans(proc.pid, log)
