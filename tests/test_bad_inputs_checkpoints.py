"""Bad-input catalogue, phase 2c: checkpoints handed to a resume or an export — crafted, damaged,
from other settings or another model — refused before anything loads them.

Each case: one exact line on stderr, exit code 2, no traceback (see ``_bad_inputs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import _bad_inputs as bi
import pytest

from rlcore.config import load_config
from rlcore.preflight import preflight

registry, tiny, run = bi.registry, bi.tiny, bi.run

# --- checkpoints (issue 15): crafted or damaged, refused before anything loads them -----------


class _Payload:
    """Unpickles as: write ``marker``, then return the real metadata it replaced."""

    def __init__(self, marker: Path, then: bytes) -> None:
        self.marker, self.then = marker, then

    def __reduce__(self):
        code = (
            f"(open({str(self.marker)!r}, 'w').write('pwned'), "
            f"__import__('pickle').loads({self.then!r}))[1]"
        )
        return (eval, (code,))


def _craft(step_dir: Path, marker: Path) -> Path:
    import pickle

    from rlcore.checkpoint.safe_load import write_manifest

    meta = step_dir / "actor" / ".metadata"
    meta.write_bytes(pickle.dumps(_Payload(marker, meta.read_bytes())))
    write_manifest(step_dir)
    return meta


def _refusal(meta: Path) -> str:
    return (
        f"refusing to load {meta}: it refers to builtins.eval, which is not part of a "
        "checkpoint's metadata (the file may have been crafted to run code); use a checkpoint "
        "you wrote"
    )


def test_export_refuses_crafted_metadata(tmp_path, capsys, registry, tiny):
    step = bi.checkpoint(tmp_path / "run", 1, tiny)
    marker = tmp_path / "pwned"
    meta = _craft(step, marker)
    argv = ["export", str(step), "--format", "hf", str(tmp_path / "out")]
    code, err = bi.cli(argv, capsys, registry)
    bi.assert_one_line(code, err, _refusal(meta))
    code, err = bi.cli(["export", str(tmp_path / "run"), str(tmp_path / "out")], capsys, registry)
    bi.assert_one_line(code, err, _refusal(meta))
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_resume_refuses_crafted_metadata(run, tmp_path, capsys, registry, tiny):
    step = bi.checkpoint(tmp_path / "old", 1, tiny)
    marker = tmp_path / "pwned"
    meta = _craft(step, marker)
    code, err = bi.train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    bi.assert_one_line(code, err, f"trainer.resume: {_refusal(meta)}")
    # trainer.resume = "auto" on the run directory holding it: refused as well, before Ray.
    code, err = bi.train_preflight(run, [f'trainer.run_dir="{tmp_path / "old"}"'], capsys, registry)
    bi.assert_one_line(code, err, _refusal(meta))
    assert not marker.exists()


def test_resume_from_a_checkpoint_missing_a_shard(run, tmp_path, capsys, registry, tiny):
    step = bi.checkpoint(tmp_path / "old", 1, tiny)
    shard = step / "actor" / "__0_0.distcp"
    shard.unlink()
    code, err = bi.train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"trainer.resume: checkpoint {step} is damaged: {shard} is missing (listed in "
        "MANIFEST.json); use an earlier one",
    )
    code, err = bi.train_preflight(run, [f'trainer.run_dir="{tmp_path / "old"}"'], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"no intact checkpoint under {tmp_path / 'old' / 'checkpoints'} (global_step_1: {shard} "
        "is missing (listed in MANIFEST.json)); remove the damaged ones or set trainer.resume = "
        '"off" to start over',
    )


# --- resume with changed settings (issue 15): refused, naming the keys ------------------------


def test_resume_with_another_learning_rate(run, capsys, registry, tmp_path):
    step = bi.checkpoint_of(run, registry, tmp_path / "old")
    lr = load_config(run, registry=registry).actor.optim.lr
    bi.case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{step}"', "actor.optim.lr=0.5"],
        f"trainer.resume: checkpoint {step} was trained with other settings: actor.optim.lr "
        f"(checkpoint {lr}, now 0.5); restore them, or start a new trainer.run_dir from its "
        "weights (rlcore export, then model.path)",
    )


def test_resume_with_another_model(run, capsys, registry, tmp_path, tiny):
    step = bi.checkpoint_of(run, registry, tmp_path / "old")
    other = bi.model_copy(tiny, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-3
    (other / "config.json").write_text(json.dumps(cfg))
    bi.case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{step}"', f'model.path="{other}"'],
        f"trainer.resume: checkpoint {step} was trained with other settings: model.path "
        f"(checkpoint {tiny}, now {other}); restore them, or start a new trainer.run_dir from "
        "its weights (rlcore export, then model.path)",
    )
    # The same model moved elsewhere resumes (preflight passes; nothing is trained here).
    moved = bi.model_copy(tiny, tmp_path / "moved")
    overrides = [f'trainer.resume="{step}"', f'model.path="{moved}"']
    preflight(load_config(run, overrides, registry), registry=registry)


# --- rlcore export: checked before the model loads (issue 15) ---------------------------------


def test_export_with_a_model_path_of_another_shape(capsys, registry, tmp_path, tiny):
    from rlcore.testing.tiny_model import build_tiny_model

    step = bi.fsdp2_like_checkpoint(tmp_path / "run", tiny)
    other = build_tiny_model(tmp_path / "other", hidden=96, heads=3, kv_heads=1)
    capsys.readouterr()  # the build's progress bars
    argv = ["export", str(step), str(tmp_path / "out"), "--model-path", str(other)]
    code, err = bi.cli(argv, capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"model {other} does not fit checkpoint {step / 'actor'}: lm_head.weight has shape "
        f"[{json.loads((other / 'config.json').read_text())['vocab_size']}, 96] in "
        f"{bi.weights_file(other)} but "
        f"[{json.loads((tiny / 'config.json').read_text())['vocab_size']}, 64] in the "
        "checkpoint; pass the run's base model with --model-path",
    )


def test_export_into_an_unwritable_place(capsys, registry, tmp_path, tiny):
    step = bi.fsdp2_like_checkpoint(tmp_path / "run", tiny)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "hf"
    code, err = bi.cli(["export", str(step), str(out)], capsys, registry)
    bi.assert_one_line(code, err, f"cannot write {out} (Not a directory); choose a writable OUT")


# --- issue 31: type-confused metadata, crafted *.pt files, links out of the checkpoint --------


def _retype_metadata(step: Path, change) -> Path:
    """Rewrite ``actor/.metadata`` with ``change(metadata)`` applied: admitted classes only,
    fields of the wrong type."""
    import pickle

    from rlcore.checkpoint.safe_load import write_manifest

    meta = step / "actor" / ".metadata"
    metadata = pickle.loads(meta.read_bytes())  # our own file, written just now
    change(metadata)
    meta.write_bytes(pickle.dumps(metadata))
    write_manifest(step)
    return meta


def _path_as_offset(metadata) -> None:
    info = next(iter(metadata.storage_data.values()))
    info.offset = Path("/etc/passwd")


def _list_as_state_dict_metadata(metadata) -> None:
    metadata.state_dict_metadata = list(metadata.state_dict_metadata.items())


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (_path_as_offset, "storage_data['model.w'].offset is a PosixPath, not a non-negative int"),
        (_list_as_state_dict_metadata, "state_dict_metadata is a list, not a dict"),
    ],
    ids=["path-as-offset", "list-as-state-dict"],
)
def test_metadata_with_fields_of_the_wrong_type(tmp_path, capsys, registry, tiny, change, problem):
    step = bi.checkpoint(tmp_path / "run", 1, tiny)
    meta = _retype_metadata(step, change)
    code, err = bi.cli(["export", str(step), str(tmp_path / "out")], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"checkpoint {step} is damaged: cannot read {meta}: {problem} (the file is damaged or "
        "was crafted); use an earlier one",
    )


class _PtPayload:
    """Unpickles as: write ``marker`` (what a crafted ``*.pt`` would do with ``torch.load``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def _craft_pt(file: Path, marker: Path) -> None:
    import torch

    from rlcore.checkpoint.safe_load import write_manifest

    torch.save({"global_step": _PtPayload(marker), "skipped_steps": 0}, file)
    write_manifest(
        file.parent if file.parent.name.startswith("global_step_") else file.parent.parent
    )


def _pt_refusal(file: Path) -> str:
    return (
        f"refusing to load {file}: it refers to eval, which a plain tensor file never holds; "
        "the file may have been crafted to run code"
    )


def test_export_refuses_a_crafted_extra_state(tmp_path, capsys, registry, tiny):
    step = bi.fsdp2_like_checkpoint(tmp_path / "run", tiny)
    marker = tmp_path / "pwned"
    extra = step / "actor" / "extra_state_rank0.pt"
    _craft_pt(extra, marker)
    code, err = bi.cli(["export", str(step), str(tmp_path / "out")], capsys, registry)
    bi.assert_one_line(code, err, _pt_refusal(extra))
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_resume_refuses_a_crafted_worker_state(run, tmp_path, capsys, registry, tiny):
    step = bi.checkpoint(tmp_path / "old", 1, tiny)
    marker = tmp_path / "pwned"
    state = step / "actor" / "worker_state_rank0.pt"
    _craft_pt(state, marker)
    code, err = bi.train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    bi.assert_one_line(code, err, f"trainer.resume: {_pt_refusal(state)}")
    assert not marker.exists()


def test_a_shard_linked_to_outside_the_checkpoint_is_refused(run, tmp_path, capsys, registry, tiny):
    step = bi.checkpoint(tmp_path / "run", 1, tiny)
    shard = step / "actor" / "__0_0.distcp"
    outside = tmp_path / "elsewhere.distcp"
    shard.rename(outside)
    shard.symlink_to(outside)
    expected = (
        f"refusing to load {shard}: it is a symbolic link to {outside.resolve()}, outside the "
        f"checkpoint {step}; copy the file into the checkpoint instead"
    )
    code, err = bi.cli(["export", str(step), str(tmp_path / "out")], capsys, registry)
    bi.assert_one_line(code, err, expected)
    code, err = bi.train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    bi.assert_one_line(code, err, f"trainer.resume: {expected}")
    # A link that stays inside the checkpoint is no problem.
    shard.unlink()
    outside.rename(step / "actor" / "kept.distcp")
    shard.symlink_to("kept.distcp")
    from rlcore.checkpoint.safe_load import verify_checkpoint

    assert verify_checkpoint(step) is None


# --- issue 31: nothing a checkpoint names decides whether code runs on export ----------------


def _needs_code(tiny: Path, folder: Path, marker: Path, where: str) -> Path:
    """A copy of ``tiny`` whose ``where`` (config.json or tokenizer_config.json) maps a class
    to ``evil.py``, which writes ``marker`` when imported."""
    model = bi.model_copy(tiny, folder)
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    data = json.loads((model / where).read_text())
    if where == "config.json":
        data["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.M"}
    else:
        data["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (model / where).write_text(json.dumps(data))
    return model


@pytest.mark.parametrize(
    ("where", "auto_map"),
    [
        ("config.json", "('AutoConfig', 'evil.EvilConfig')"),
        ("tokenizer_config.json", "('AutoTokenizer', ['evil.EvilTokenizer', None])"),
    ],
)
def test_export_runs_no_code_named_by_a_downloaded_run(
    tmp_path, capsys, registry, tiny, where, auto_map
):
    from rlcore.checkpoint.safe_load import write_manifest

    marker = tmp_path / "pwned"
    run_dir = tmp_path / "downloaded-run"
    model = _needs_code(tiny, run_dir / "model", marker, where)
    step = bi.fsdp2_like_checkpoint(run_dir, model)
    config = step / "config.toml"
    config.write_text(f'[model]\npath = "{model}"\ntrust_remote_code = true\n')
    write_manifest(step)
    expected = (
        f"{model} needs code of its own ({where} has an auto_map: {auto_map}); rlcore export "
        f"runs no code named by a checkpoint (model.trust_remote_code = true in {config} is "
        f"not used): pass --trust-remote-code if you trust {model}"
    )
    out = tmp_path / "out"
    for extra in ([], ["--model-path", str(model)]):
        code, err = bi.cli(["export", str(run_dir), str(out), *extra], capsys, registry)
        bi.assert_one_line(code, err, expected)
    assert not marker.exists()
    assert not out.exists()


def test_resume_with_another_lora_rank(run, capsys, registry, tmp_path):
    lora = ["actor.engine.lora_rank=4", "actor.optim.lr=1e-4"]
    step = bi.checkpoint_of(run, registry, tmp_path / "old", lora)
    bi.case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{step}"', "actor.engine.lora_rank=8", "actor.optim.lr=1e-4"],
        f"trainer.resume: checkpoint {step} was trained with other settings: "
        "actor.engine.lora_rank (checkpoint 4, now 8); restore them, or start a new "
        "trainer.run_dir from its weights (rlcore export, then model.path)",
    )


# --- issue 50 item 7: the step a checkpoint records, non-finite weights ----------------------


def test_resume_refuses_a_state_file_of_another_step(run, tmp_path, capsys, registry, tiny):
    # trainer_state.json copied from step 1 into global_step_2 (same size: the manifest
    # cannot tell): it used to resume as step 1 and log steps [1, 2, 2, 3].
    step = bi.checkpoint(tmp_path / "old", 2, tiny)
    state = step / "trainer_state.json"
    state.write_text(state.read_text().replace('"step": 2', '"step": 1'))
    code, err = bi.train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"trainer.resume: checkpoint {step} is damaged: {state} says step 1, but the folder is "
        "global_step_2; use an earlier one",
    )


def _nan_checkpoint(run: Path, registry, run_dir: Path, model: Path) -> tuple[Path, str]:
    """A checkpoint of ``run``'s settings whose actor weights are ``model``'s, one of them NaN."""
    import math

    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from rlcore.checkpoint import CheckpointManager, save_driver_state
    from rlcore.config import config_to_dict, dump_toml

    weights = load_file(bi.weights_file(model))
    name = sorted(weights)[-1]
    weights[name][0].fill_(math.nan)
    text = dump_toml(config_to_dict(load_config(run, [], registry=registry)))

    def write(tmp: Path) -> None:
        dcp.save({"model": weights}, checkpoint_id=str(tmp / "actor"), no_dist=True)
        save_driver_state(tmp, step=1, dataloader_state={"epoch": 0})
        (tmp / "config.toml").write_text(text)

    return CheckpointManager(run_dir / "checkpoints").save(1, write), name


def test_resume_refuses_non_finite_weights_unless_told(run, tmp_path, capsys, registry, tiny):
    step, name = _nan_checkpoint(run, registry, tmp_path / "old", tiny)
    code, err = bi.train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    bi.assert_one_line(
        code,
        err,
        f"trainer.resume: checkpoint {step}: actor weight {name} holds NaN or inf; resume from "
        "an earlier checkpoint, or set trainer.check_finite_on_resume = false to load it anyway",
    )
    # The opt-out: the checks before Ray pass (nothing is trained here).
    overrides = [f'trainer.resume="{step}"', "trainer.check_finite_on_resume=false"]
    preflight(load_config(run, overrides, registry), registry=registry)
