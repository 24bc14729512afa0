"""CheckpointManager: atomic saves, the latest pointer, pruning, resume paths, driver state."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.checkpoint import (
    COMPLETE_MARKER,
    LATEST_FILE,
    RNG_FILE,
    STATE_FILE,
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    find_checkpoint,
    load_driver_state,
    restore_rng_state,
    save_driver_state,
)
from rlcore.errors import RlcoreError


def writer(tag: str):
    """A write_fn that writes a small engine-like tree."""

    def write(tmp: Path) -> None:
        (tmp / "actor").mkdir()
        (tmp / "actor" / "shard0.bin").write_bytes(tag.encode() * 100)
        (tmp / "config.toml").write_text(f'tag = "{tag}"\n')

    return write


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# --- save / latest ----------------------------------------------------------------------------


def test_save_writes_step_dir_marker_and_latest(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt")
    final = mgr.save(3, writer("a"))
    assert final == tmp_path / "ckpt" / "global_step_3"
    assert (final / "actor" / "shard0.bin").read_bytes() == b"a" * 100
    assert json.loads((final / COMPLETE_MARKER).read_text())["step"] == 3
    assert (tmp_path / "ckpt" / LATEST_FILE).read_text() == "global_step_3\n"
    assert visible(tmp_path / "ckpt") == ["global_step_3", "latest"]  # no temp files left
    mgr.save(6, writer("b"))
    assert mgr.latest() == tmp_path / "ckpt" / "global_step_6"
    assert [p.name for p in mgr.checkpoints()] == ["global_step_3", "global_step_6"]


def test_crash_inside_write_fn_keeps_previous_latest(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, writer("a"))

    def crashing(tmp: Path) -> None:
        writer("b")(tmp)
        msg = "worker died while writing its shard"
        raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match="worker died"):
        mgr.save(2, crashing)
    assert visible(tmp_path) == ["global_step_1", "latest"]  # no partial step dir
    assert mgr.latest() == tmp_path / "global_step_1"
    assert mgr.resolve_resume("auto") == tmp_path / "global_step_1"


def _killed_save(root: str) -> None:
    def write(tmp: Path) -> None:
        (tmp / "actor").mkdir()
        (tmp / "actor" / "half.bin").write_bytes(b"x" * 10)
        os._exit(9)  # a SIGKILL-like death: no cleanup, no exception handlers

    CheckpointManager(root).save(2, write)


def test_killed_process_leaves_tmp_dir_that_is_ignored_then_cleaned(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, writer("a"))
    proc = multiprocessing.get_context("fork").Process(target=_killed_save, args=(str(tmp_path),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 9
    leftovers = [n for n in visible(tmp_path) if n.startswith(".tmp-")]
    assert leftovers == [".tmp-global_step_2"]
    # Not a checkpoint: latest, auto-resume and an explicit run-dir path all skip it.
    assert mgr.latest() == tmp_path / "global_step_1"
    assert find_checkpoint(tmp_path) == tmp_path / "global_step_1"
    assert [p.name for p in mgr.checkpoints()] == ["global_step_1"]
    mgr.save(2, writer("c"))  # the next save cleans it and writes the step for real
    assert visible(tmp_path) == ["global_step_1", "global_step_2", "latest"]
    assert (tmp_path / "global_step_2" / "actor" / "shard0.bin").read_bytes() == b"c" * 100


def test_latest_pointer_to_incomplete_dir_falls_back_with_a_log(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, writer("a"))
    mgr.save(2, writer("b"))
    (tmp_path / "global_step_2" / COMPLETE_MARKER).unlink()  # e.g. a partial manual copy
    with caplog.at_level(logging.WARNING, logger="rlcore.checkpoint"):
        assert mgr.latest() == tmp_path / "global_step_1"
    assert "names 'global_step_2', which is not a complete checkpoint" in caplog.text
    # A pointer that tries to leave the root is not followed either.
    (tmp_path / LATEST_FILE).write_text("../elsewhere/global_step_9\n")
    assert mgr.latest() == tmp_path / "global_step_1"


def test_latest_without_pointer_takes_newest_complete_by_step_number(tmp_path):
    mgr = CheckpointManager(tmp_path)
    for step in (2, 10, 9):
        mgr.save(step, writer(str(step)))
    (tmp_path / LATEST_FILE).unlink()
    assert mgr.latest() == tmp_path / "global_step_10"  # numeric, not lexical order
    assert CheckpointManager(tmp_path / "nothing").latest() is None


def test_saving_an_existing_step_replaces_it(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(4, writer("old"))
    mgr.save(4, writer("new"))
    assert (tmp_path / "global_step_4" / "config.toml").read_text() == 'tag = "new"\n'
    assert visible(tmp_path) == ["global_step_4", "latest"]


# --- pruning ----------------------------------------------------------------------------------


def test_keep_last_k_prunes_oldest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3, 4):
        mgr.save(step, writer(str(step)))
    assert visible(tmp_path) == ["global_step_3", "global_step_4", "latest"]


def test_prune_never_removes_the_checkpoint_just_written(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1)
    mgr.save(5, writer("a"))
    mgr.save(8, writer("b"))
    # A resume from an older step saves step 6 while step 8 (a newer step) is on disk.
    mgr.save(6, writer("c"))
    assert [p.name for p in mgr.checkpoints()] == ["global_step_6", "global_step_8"]
    assert mgr.latest() == tmp_path / "global_step_6"


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(CheckpointError, match=r"trainer.keep_last must be >= 1"):
        CheckpointManager(tmp_path, keep_last=0)


# --- resume paths -----------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    mgr = CheckpointManager(run / "checkpoints")
    mgr.save(1, writer("a"))
    mgr.save(2, writer("b"))
    return run


def test_resolve_resume_off_auto_and_paths(run_dir, tmp_path):
    mgr = CheckpointManager(run_dir / "checkpoints")
    step1, step2 = (
        run_dir / "checkpoints" / "global_step_1",
        run_dir / "checkpoints" / "global_step_2",
    )
    assert mgr.resolve_resume("off") is None
    assert mgr.resolve_resume("auto") == step2
    assert CheckpointManager(tmp_path / "fresh").resolve_resume("auto") is None
    assert mgr.resolve_resume(str(step1)) == step1  # a step directory
    assert mgr.resolve_resume(str(run_dir / "checkpoints")) == step2  # a checkpoint root
    assert mgr.resolve_resume(str(run_dir)) == step2  # a run directory


def test_resolve_resume_bad_paths_are_one_line_errors(run_dir, tmp_path):
    mgr = CheckpointManager(run_dir / "checkpoints")
    missing = tmp_path / "nope"
    with pytest.raises(RlcoreError) as err:
        mgr.resolve_resume(str(missing))
    assert str(err.value) == f"trainer.resume: checkpoint {missing} does not exist"

    partial = run_dir / "checkpoints" / "global_step_2"
    (partial / COMPLETE_MARKER).unlink()
    with pytest.raises(CheckpointError) as err:
        mgr.resolve_resume(str(partial))
    assert str(err.value) == (
        f"trainer.resume: checkpoint {partial} is incomplete (no COMPLETE file): it was "
        "interrupted while being written; use an earlier one"
    )

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError) as err:
        mgr.resolve_resume(str(empty))
    assert str(err.value) == (
        f"trainer.resume: no complete checkpoint (global_step_N directory) in {empty}"
    )
    assert "\n" not in str(err.value)


# --- driver state -----------------------------------------------------------------------------


def test_driver_state_round_trip_restores_rng_streams(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.random(), np.random.rand(), torch.rand(1)  # advance away from the seeds
    save_driver_state(
        tmp_path,
        step=7,
        dataloader_state={"epoch": 1, "position": 3, "seed": 0},
        extra={"kl_coef": 0.05},
        rng=capture_rng_state(),
    )
    expected = (random.random(), np.random.rand(4), torch.rand(4), np.random.normal())
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # scramble

    state = load_driver_state(tmp_path)
    assert state.step == 7
    assert state.dataloader == {"epoch": 1, "position": 3, "seed": 0}
    assert state.extra == {"kl_coef": 0.05}
    assert state.rng is not None
    restore_rng_state(state.rng)
    got = (random.random(), np.random.rand(4), torch.rand(4), np.random.normal())
    assert got[0] == expected[0]
    np.testing.assert_array_equal(got[1], expected[1])
    assert torch.equal(got[2], expected[2])
    assert got[3] == expected[3]


def test_driver_state_without_rng_and_missing_state(tmp_path):
    save_driver_state(tmp_path, step=0, dataloader_state={"epoch": 0, "position": 0, "seed": 1})
    assert load_driver_state(tmp_path).rng is None
    with pytest.raises(CheckpointError, match=f"has no {STATE_FILE}"):
        load_driver_state(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="not JSON-serialisable"):
        save_driver_state(tmp_path, step=1, dataloader_state={}, extra={"x": object()})


class _Exploit:
    """A pickle payload: unpickling it would call os.system (we point it at a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_in_rng_state_is_refused(tmp_path):
    save_driver_state(tmp_path, step=1, dataloader_state={"epoch": 0, "position": 1, "seed": 0})
    marker = tmp_path / "pwned"
    torch.save({"python": _Exploit(marker)}, tmp_path / RNG_FILE)
    with pytest.raises(CheckpointError) as err:
        load_driver_state(tmp_path)
    assert str(err.value).startswith(f"refusing to load {tmp_path / RNG_FILE}: not a plain tensor")
    assert "\n" not in str(err.value)
    assert not marker.exists()  # the payload never ran
