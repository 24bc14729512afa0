"""Checkpoints never run code, and a damaged one is detected before anything loads it.

Real DCP checkpoints (``dcp.save(no_dist=True)``, the format the FSDP2 engine writes) in real
``global_step_N`` directories (:class:`CheckpointManager`); the crafted files carry a
``__reduce__`` payload that writes a marker file, and each test first shows that torch's own
reader would run it.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlcore.checkpoint import CheckpointError, CheckpointManager, find_checkpoint
from rlcore.checkpoint.safe_load import (
    MANIFEST_FILE,
    load_dcp_metadata,
    safe_dcp_load,
    verify_checkpoint,
    write_manifest,
)


class Payload:
    """Unpickles as: write ``marker``, then return ``then`` (the object it impersonates)."""

    def __init__(self, marker: Path, then: bytes) -> None:
        self.marker = marker
        self.then = then

    def __reduce__(self):
        code = (
            f"(open({str(self.marker)!r}, 'w').write('pwned'), "
            f"__import__('pickle').loads({self.then!r}))[1]"
        )
        return (eval, (code,))


def engine_state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(4, 4, generator=g), "b": torch.zeros(4)},
        "optim": {"param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "name": "g"}]},
    }


def save_step(root: Path, step: int, state: dict | None = None) -> Path:
    from rlcore.checkpoint import save_driver_state

    def write(tmp: Path) -> None:
        dcp.save(state or engine_state(), checkpoint_id=str(tmp / "actor"), no_dist=True)
        save_driver_state(tmp, step=step, dataloader_state={"epoch": 0, "index": step})

    return CheckpointManager(root).save(step, write)


def craft_metadata(actor: Path, marker: Path) -> None:
    meta = actor / ".metadata"
    meta.write_bytes(pickle.dumps(Payload(marker, meta.read_bytes())))
    write_manifest(actor.parent)  # a careful attacker updates the sizes too


def test_the_payload_runs_under_torchs_own_reader(tmp_path):
    """The attack is real: torch's FileSystemReader executes it and returns real metadata."""
    step = save_step(tmp_path / "ck", 1)
    marker = tmp_path / "pwned"
    craft_metadata(step / "actor", marker)
    dcp.FileSystemReader(str(step / "actor")).read_metadata()
    assert marker.read_text() == "pwned"


def test_real_metadata_loads_and_a_crafted_one_is_refused(tmp_path):
    step = save_step(tmp_path / "ck", 1)
    meta = step / "actor" / ".metadata"
    good = load_dcp_metadata(meta)
    assert set(good.state_dict_metadata) >= {"model.w", "model.b", "optim.param_groups.0.lr"}
    marker = tmp_path / "pwned"
    craft_metadata(step / "actor", marker)
    with pytest.raises(CheckpointError) as info:
        load_dcp_metadata(meta)
    assert str(info.value) == (
        f"refusing to load {meta}: it refers to builtins.eval, which is not part of a "
        "checkpoint's metadata (the file may have been crafted to run code); use a checkpoint "
        "you wrote"
    )
    assert not marker.exists()


def test_safe_dcp_load_restores_and_refuses(tmp_path):
    step = save_step(tmp_path / "ck", 1)
    target = engine_state()
    target["model"] = {k: torch.full_like(v, 7.0) for k, v in target["model"].items()}
    target["optim"]["param_groups"][0]["lr"] = 0.5
    safe_dcp_load(target, step / "actor", no_dist=True)
    want = engine_state()
    assert torch.equal(target["model"]["w"], want["model"]["w"])
    assert target["optim"]["param_groups"][0]["lr"] == 1e-3
    assert target["optim"]["param_groups"][0]["betas"] == (0.9, 0.99)
    marker = tmp_path / "pwned"
    craft_metadata(step / "actor", marker)
    with pytest.raises(CheckpointError, match="refusing to load"):
        safe_dcp_load(engine_state(), step / "actor", no_dist=True)
    assert not marker.exists()


def test_a_crafted_bytes_item_is_refused_by_verification_and_by_the_loader(tmp_path):
    marker = tmp_path / "pwned"
    state = engine_state()
    # A non-tensor item is written with torch.save: its __reduce__ becomes the payload.
    state["optim"]["param_groups"][0]["name"] = Payload(marker, pickle.dumps("g"))
    step = save_step(tmp_path / "ck", 1, state)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"refusing to load .*__0_0\.distcp: an item"):
        verify_checkpoint(step)
    with pytest.raises(
        CheckpointError, match=r"refusing to load item 'optim\.param_groups\.0\.name'"
    ):
        safe_dcp_load(engine_state(), step / "actor", no_dist=True)
    assert not marker.exists()


def test_find_checkpoint_refuses_a_crafted_checkpoint_in_one_line(tmp_path):
    step = save_step(tmp_path / "ck", 1)
    marker = tmp_path / "pwned"
    craft_metadata(step / "actor", marker)
    for path in (step, tmp_path / "ck"):
        with pytest.raises(CheckpointError) as info:
            find_checkpoint(path, key="trainer.resume")
        assert "\n" not in str(info.value)
        assert "builtins.eval" in str(info.value)
    assert not marker.exists()


# --- damaged checkpoints ---------------------------------------------------------------------


def _damage(step: Path, how: str) -> str:
    """Damage ``step`` as ``how`` says; returns the problem verify_checkpoint must report."""
    actor = step / "actor"
    shard = actor / "__0_0.distcp"
    if how == "missing shard":
        shard.unlink()
        return f"{shard} is missing (listed in {MANIFEST_FILE})"
    if how == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:100])
        return f"{shard} has 100 bytes, {MANIFEST_FILE} says"
    if how == "missing actor":
        for f in actor.iterdir():
            f.unlink()
        actor.rmdir()
        return f"{actor / '.metadata'} is missing (listed in {MANIFEST_FILE})"
    if how == "no marker":
        (step / "COMPLETE").unlink()
        return "no COMPLETE marker"
    if how == "garbage metadata":
        meta = actor / ".metadata"
        meta.write_bytes(b"\x00garbage" * 4)
        (step / MANIFEST_FILE).unlink()  # an older checkpoint, without a manifest
        return f"cannot read {meta}: not a checkpoint metadata file"
    if how == "truncated shard, no manifest":
        (step / MANIFEST_FILE).unlink()
        shard.write_bytes(shard.read_bytes()[:100])
        return f"shard {shard} is truncated (100 bytes, its metadata needs"
    raise AssertionError(how)


DAMAGE = [
    "missing shard",
    "truncated shard",
    "missing actor",
    "no marker",
    "garbage metadata",
    "truncated shard, no manifest",
]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_latest_falls_back_to_the_newest_intact_one(tmp_path, caplog, how):
    root = tmp_path / "ck"
    first = save_step(root, 1)
    latest = save_step(root, 2)
    assert verify_checkpoint(latest) is None
    problem = _damage(latest, how)
    found = verify_checkpoint(latest)
    assert found is not None
    assert problem in found, found
    with caplog.at_level(logging.WARNING, logger="rlcore.checkpoint.safe_load"):
        assert CheckpointManager(root).latest() == first
    if how != "no marker":  # without its marker it is an interrupted save, not a checkpoint
        assert f"skipping checkpoint {latest}: " in caplog.text
        assert f"resuming from {first}, the newest intact checkpoint" in caplog.text
    with pytest.raises(CheckpointError) as info:
        find_checkpoint(latest, key="trainer.resume")
    assert str(info.value).startswith(f"trainer.resume: checkpoint {latest} is")
    assert "\n" not in str(info.value)


def test_no_intact_checkpoint_is_one_line(tmp_path):
    root = tmp_path / "ck"
    only = save_step(root, 1)
    _damage(only, "missing shard")
    with pytest.raises(CheckpointError) as info:
        CheckpointManager(root).resolve_resume("auto")
    shard = only / "actor" / "__0_0.distcp"
    assert str(info.value) == (
        f"no intact checkpoint under {root} (global_step_1: {shard} is missing (listed in "
        f'{MANIFEST_FILE})); remove the damaged ones or set trainer.resume = "off" to start over'
    )


@pytest.mark.parametrize(
    "pointer", [b"\xff\xfe\x00garbage", b"../../etc", b"global_step_99\n", b""], ids=repr
)
def test_a_corrupt_latest_pointer_is_ignored_with_a_warning(tmp_path, caplog, pointer):
    root = tmp_path / "ck"
    save_step(root, 1)
    newest = save_step(root, 2)
    (root / "latest").write_bytes(pointer)
    with caplog.at_level(logging.WARNING, logger="rlcore.checkpoint.safe_load"):
        assert CheckpointManager(root).latest() == newest
    assert str(root / "latest") in caplog.text


def test_an_intact_checkpoint_passes_and_lists_every_file(tmp_path):
    import json

    step = save_step(tmp_path / "ck", 3)
    assert verify_checkpoint(step) is None
    files = json.loads((step / MANIFEST_FILE).read_text())["files"]
    assert {"actor/.metadata", "actor/__0_0.distcp", "trainer_state.json"} <= set(files)
    assert files["actor/__0_0.distcp"] == (step / "actor" / "__0_0.distcp").stat().st_size
