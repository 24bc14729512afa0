"""Bad-input catalogue, phase 3: what goes wrong once training runs (in the driver, stubbed
Ray) — still one line, exit 2, nothing earlier lost.
"""

from __future__ import annotations

import os
import sys

import _bad_inputs as bi
import pytest

registry, tiny, run = bi.registry, bi.tiny, bi.run


def test_a_system_exit_during_training_is_one_line(run, capsys, registry, monkeypatch, tmp_path):
    """Something in the driver (an in-driver reward, a plugin) calls ``sys.exit``: one line
    naming where, exit 2, instead of a silent exit 3. Ray and training are stubbed out: the
    preflight and the CLI's handling are real."""
    import rlcore.trainer
    import rlcore.workers.cluster

    def exits(config, prepared, **_options):
        sys.exit(3)

    monkeypatch.setattr(rlcore.trainer, "run_training", exits)
    monkeypatch.setattr(rlcore.workers.cluster, "start_ray", lambda resources: False)
    run_dir = tmp_path / "r"
    code, err = bi.cli(["train", str(run), f'trainer.run_dir="{run_dir}"'], capsys, registry)
    line = exits.__code__.co_firstlineno + 1
    bi.assert_one_line(
        code,
        err,
        f"training stopped: SystemExit(3) raised in exits ({__file__}:{line}); no checkpoint "
        "saved yet; a new run starts from step 0",
    )
    assert (run_dir / ".rlcore.lock").read_text() != ""  # the lock was taken, then freed
    from rlcore.trainer.runlock import acquire_run_lock

    acquire_run_lock(run_dir).release()


def test_a_checkpoints_folder_made_read_only_during_the_run(tmp_path, tiny):
    """The trainer's save path (``CheckpointManager.save``) when ``checkpoints/`` stopped taking
    writes after the start: one line naming the folder, and the earlier checkpoint and
    ``latest`` untouched."""
    from rlcore.checkpoint import CheckpointError, CheckpointManager
    from rlcore.checkpoint.safe_load import verify_checkpoint

    first = bi.checkpoint(tmp_path / "run", 1, tiny)
    root = first.parent
    reason = "Permission denied" if os.geteuid() != 0 else "Operation not permitted"
    wrote = []
    with bi.unwritable(root), pytest.raises(CheckpointError) as info:
        CheckpointManager(root).save(2, wrote.append)
    assert str(info.value) == (
        f"cannot save checkpoint step 2 in {root}: {root / '.tmp-global_step_2'}: {reason}; "
        "make the folder writable (or free space) and rerun to resume; the last saved "
        "checkpoint, global_step_1, is intact"
    )
    assert wrote == []  # refused before any worker was asked to write
    assert (root / "latest").read_text().strip() == "global_step_1"
    assert verify_checkpoint(first) is None
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest"]


def test_ray_failing_to_start_is_one_line(run, capsys, registry, monkeypatch, tmp_path):
    """Ray's own start-up error (seen on an overloaded machine: its raylet registers after the
    30 s Ray waits) is one line, exit 2, the run lock freed. The preflight and CLI are real."""
    import rlcore.workers.cluster

    def overloaded(resources):
        raise Exception(  # what ray._private.node raises, verbatim
            "The current node timed out during startup. This could happen because some of the "
            "raylet failed to startup or the GCS has become overloaded."
        )

    monkeypatch.setattr(rlcore.workers.cluster, "start_ray", overloaded)
    run_dir = tmp_path / "r"
    code, err = bi.cli(["train", str(run), f'trainer.run_dir="{run_dir}"'], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        "Ray did not start: Exception: The current node timed out during startup. This could "
        "happen because some of the raylet failed to startup or the GCS has become overloaded; "
        "nothing was trained. Free CPU or memory and rerun; Ray's logs are under "
        "/tmp/ray/session_latest/logs",
    )
    from rlcore.trainer.runlock import acquire_run_lock

    acquire_run_lock(run_dir).release()  # freed


@pytest.mark.parametrize("where", ["driver", "worker", "torch"])
def test_a_disk_full_during_a_save_is_one_line(tmp_path, tiny, where):
    """The trainer's save path when the disk fills up: in the driver's own write (ENOSPC), in
    a worker's (delivered as a WorkerError carrying it) or as torch's writer says it (no
    errno, the text only). One line naming the folder, both steps; nothing of the failed save
    is left and the previous checkpoint verifies (the e2e case on a real tmpfs is in
    test_save_faults.py)."""
    import errno

    from rlcore.checkpoint import CheckpointError, CheckpointManager
    from rlcore.checkpoint.safe_load import verify_checkpoint
    from rlcore.errors import WorkerError

    first = bi.checkpoint(tmp_path / "run", 1, tiny)
    root = first.parent
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root / "x"))

    def write(tmp):
        (tmp / "partial").write_bytes(b"x" * 100)
        if where == "driver":
            raise full
        if where == "worker":
            error = WorkerError("role actor_rollout_ref rank 0 failed in save_checkpoint: ...")
            error.remote_cause = full
            raise error
        msg = "[enforce fail at inline_container.cc:664] . unexpected pos 320 vs 214: " + (
            os.strerror(errno.ENOSPC)
        )
        raise RuntimeError(msg)

    with pytest.raises(CheckpointError) as info:
        CheckpointManager(root).save(2, write)
    assert str(info.value) == (
        f"no space left on {root} while saving step 2; the previous checkpoint at step 1 is intact"
    )
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "latest"]
    assert verify_checkpoint(first) is None
