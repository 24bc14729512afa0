"""A stopped worker (``kill -STOP``) ends the run with one line naming its role, rank and pid,
within ``resources.heartbeat_timeout_s`` (here set by ``RLCORE_HEARTBEAT_TIMEOUT_S``, which the
CLI maps onto it) plus one beat and two polls (see rlcore.workers.liveness), then exits;
nothing of the run is left behind. A real ``rlcore train`` in its own session: the colocated
policy worker, and, with the rollout on a pool of its own (one-step-off), the rollout worker
and the trainer's worker (the other side of every weight sync)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TIMEOUT_S = 6
SPLIT = """placement = { rollout = "gen" }
[resources.pools.gen]
processes_per_node = 1
"""
RM_POOL = """placement = {{ rm = "rmpool" }}
[resources.pools.rmpool]
processes_per_node = 1
[reward_model]
enable = true
model = {{ path = "{rm}" }}
"""


def _session(sid: int) -> list[int]:
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


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _started(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])  # starttime, clock ticks after boot


@pytest.mark.parametrize(
    ("placement", "stop_class"),
    [
        ("colocated", "ray::ColocatedWorker"),
        ("one_step_off", "ray::RolloutWorker"),
        ("one_step_off", "ray::ColocatedWorker"),
        # the reward model on a pool of its own: the process started after the policy's
        # (rlcore.trainer.builder starts the global pool's group first)
        ("rm_pool", "ray::ColocatedWorker"),
    ],
)
def test_a_stopped_worker_ends_the_run_in_bounded_time(tmp_path, placement, stop_class):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.testing.tiny_model import build_tiny_reward_model
    from rlcore.workers.liveness import BEAT_S, POLL_S

    model = tiny_run_model(tmp_path / "model")
    extra, async_mode = "", None
    if placement == "one_step_off":
        extra, async_mode = SPLIT, "one_step_off"
    elif placement == "rm_pool":
        rm = build_tiny_reward_model(tmp_path / "rm", from_model=model, seed=3)
        extra = RM_POOL.format(rm=rm)
    data = write_jsonl(
        arithmetic_rows([(a, b) for a in range(4) for b in range(4)]), tmp_path / "t.jsonl"
    )
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        tiny_run_toml(
            model=model,
            train_files=[data],
            run_dir=tmp_path / "run",
            total_steps=200,
            save_freq=1,
            micro_batch_size=4,
            experiment_name="liveness",
            extra=extra,
        )
        .replace(
            "[trainer]\n",
            f'[trainer]\nasync_mode = "{async_mode}"\n' if async_mode else "[trainer]\n",
            1,
        )
        # No restart: the stopped worker ends the run (tests/test_recovery.py: replaced).
        .replace("[trainer]\n", "[trainer]\nmax_worker_restarts = 0\n", 1)
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"OMP_NUM_THREADS": "1", "RLCORE_HEARTBEAT_TIMEOUT_S": str(TIMEOUT_S)}
    log = tmp_path / "train.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcore.cli", "train", str(cfg)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        latest = tmp_path / "run" / "checkpoints" / "latest"
        deadline = time.monotonic() + 180
        while not latest.exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        workers = [p for p in _session(proc.pid) if _cmdline(p).startswith(stop_class)]
        assert len(workers) == (2 if placement == "rm_pool" else 1), [
            c for p in _session(proc.pid) if (c := _cmdline(p)).startswith("ray::")
        ]
        workers = [max(workers, key=_started)]
        os.kill(workers[0], signal.SIGSTOP)
        stopped, stopped_wall = time.monotonic(), time.time()
        code = proc.wait(timeout=TIMEOUT_S + 60)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    # The driver logs when the run ended (HH:MM:SS) apart from the shutdown that follows.
    ended = re.search(r"^(\d\d):(\d\d):(\d\d) INFO rlcore\.trainer\.run: run ending", out, re.M)
    assert ended, out[-3000:]
    h, m, s = (int(x) for x in ended.groups())
    at = time.localtime(stopped_wall)
    detected = ((h - at.tm_hour) * 3600 + (m - at.tm_min) * 60 + s - at.tm_sec) % 86400
    bound = TIMEOUT_S + BEAT_S + 2 * POLL_S
    print(
        f"SIGSTOP: the run ended {detected} s after the stop (bound {bound:g} s), the driver "
        f"exited after {took:.1f} s (exit {code})"
    )
    assert code == 2, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, out[-3000:]
    assert re.fullmatch(
        rf"error: role [\w.]+(?: on pool '\w+'(?:\.\w+)?)? rank 0 "
        rf"\(node [\d.]+, pid {workers[0]}\) stopped responding in \w+: no heartbeat for \d+ s "
        rf"\(resources\.heartbeat_timeout_s = {TIMEOUT_S}\); the process is stopped or wedged "
        r"\(after 0 worker restart\(s\); trainer\.max_worker_restarts = 0\); the last "
        r"checkpoint is intact",
        errors[0],
    ), errors
    assert "Traceback" not in out
    # The run ends within timeout + beat + 2 polls (rlcore.workers.liveness), + 1 s for the
    # log's whole seconds; the exit follows the shutdown of Ray and the workers, which takes
    # seconds on a contended machine.
    assert detected <= bound + 1, (detected, bound)
    assert took < bound + 30, took
    deadline = time.monotonic() + 20
    while left := _session(proc.pid):
        if time.monotonic() > deadline:
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"processes of the run remain: {[(p, _cmdline(p)) for p in left]}")
        time.sleep(0.2)
