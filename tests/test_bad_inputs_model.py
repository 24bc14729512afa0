"""Bad-input catalogue, phase 2b: model folder, tokenizer, weights, environment, run directory,
checked by ``rlcore train`` before Ray.

Each case: one exact line on stderr, exit code 2, no traceback (see ``_bad_inputs.py``).
"""

from __future__ import annotations

import json
import os
import shutil

import _bad_inputs as bi
import pytest

registry, tiny, run = bi.registry, bi.tiny, bi.run


def test_model_path_missing(run, capsys, registry, tmp_path):
    missing = tmp_path / "no-model"
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{missing}"'],
        f"model.path: {missing} does not exist; give a local Hugging Face model folder",
    )


def test_model_path_without_weights(run, capsys, registry, tmp_path, tiny):
    folder = tmp_path / "noweights"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {folder} has no weights (*.safetensors or pytorch_model*.bin); download or "
        "save the model there",
    )


def test_model_path_without_config(run, capsys, registry, tmp_path, tiny):
    folder = tmp_path / "noconfig"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("config.json"))
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {folder} has no config.json; it is not a Hugging Face model folder",
    )


def test_tokenizer_without_chat_template(run, capsys, registry, tmp_path, tiny):
    folder = tmp_path / "notemplate"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("chat_template.jinja"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.tokenizer_path: the tokenizer in {folder} has no chat template; add one "
        "(chat_template.jinja) or set data.apply_chat_template = false for plain-text prompts",
    )


def test_model_folder_without_tokenizer_files(run, capsys, registry, tmp_path, tiny):
    folder = tmp_path / "notok"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.tokenizer_path: {folder} has no tokenizer files (tokenizer.json, tokenizer.model, "
        "vocab.json, spiece.model); save the tokenizer there or set model.tokenizer_path",
    )


def test_critic_model_without_weights(run, capsys, registry, tmp_path, tiny):
    folder = tmp_path / "critic"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    bi.case(
        run,
        capsys,
        registry,
        ["algorithm.name=ppo", f'critic.model_path="{folder}"'],
        f"critic.model_path: {folder} has no weights (*.safetensors or pytorch_model*.bin); "
        "download or save the model there",
    )


def test_resume_path_missing(run, capsys, registry, tmp_path):
    missing = tmp_path / "runs" / "old"
    bi.case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{missing}"'],
        f"trainer.resume: checkpoint {missing} does not exist",
    )


def test_zero_byte_weights(run, capsys, registry, tmp_path, tiny):
    folder = bi.model_copy(tiny, tmp_path / "m")
    weights = bi.weights_file(folder)
    weights.write_bytes(b"")
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {weights} is not a complete safetensors file (0 bytes); download or save "
        "the model again",
    )


def test_truncated_weights(run, capsys, registry, tmp_path, tiny):
    folder = bi.model_copy(tiny, tmp_path / "m")
    weights = bi.weights_file(folder)
    full = weights.read_bytes()
    weights.write_bytes(full[: len(full) // 2])
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {weights} is truncated ({len(full) // 2} bytes, its header describes "
        f"{len(full)}); download or save the model again",
    )


def test_empty_model_config(run, capsys, registry, tmp_path, tiny):
    folder = bi.model_copy(tiny, tmp_path / "m")
    (folder / "config.json").write_text("{}")
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {folder / 'config.json'} names no model_type; it is not a transformers "
        "model config",
    )


def test_config_shapes_do_not_match_the_weights(run, capsys, registry, tmp_path, tiny):
    folder = bi.model_copy(tiny, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    cfg["hidden_size"] = hidden * 2
    (folder / "config.json").write_text(json.dumps(cfg))
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {folder / 'config.json'} says vocab_size={vocab}, hidden_size={hidden * 2} "
        f"but the weights hold model.embed_tokens.weight of shape [{vocab}, {hidden}]; the "
        "config and the weights are from different models",
    )


def test_model_vocab_smaller_than_the_tokenizer(run, capsys, registry, tmp_path, tiny):
    from safetensors.torch import load_file, save_file

    from rlcore.data import load_tokenizer

    folder = bi.model_copy(tiny, tmp_path / "m")
    weights = bi.weights_file(folder)
    tensors = load_file(weights)
    cfg = json.loads((folder / "config.json").read_text())
    small = cfg["vocab_size"] - 40
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name] = tensors[name][:small].contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})
    cfg["vocab_size"] = small
    (folder / "config.json").write_text(json.dumps(cfg))
    n_tokens = len(load_tokenizer(folder))
    bi.case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: the model's vocab_size ({small}) is smaller than the tokenizer's "
        f"{n_tokens} tokens; use the tokenizer saved with this model (model.tokenizer_path)",
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "RLCORE_COLLECTIVE_TIMEOUT_S",
            "abc",
            'resources.collective_timeout_s: expected a number, got "abc" '
            "(set by RLCORE_COLLECTIVE_TIMEOUT_S='abc')",
        ),
        (
            "RLCORE_MAX_GRAD_NORM",
            "0",
            "trainer.grad_norm_ceiling: must be > 0.0, got 0.0 (set by RLCORE_MAX_GRAD_NORM='0')",
        ),
        (
            "RLCORE_NUM_THREADS",
            "two",
            'resources.driver_num_threads: expected an integer, got "two" '
            "(set by RLCORE_NUM_THREADS='two')",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("RLCORE") else None,
)
def test_bad_environment_variable(run, capsys, registry, monkeypatch, name, value, message):
    """The CLI maps each variable onto its config key: the key's own check, naming both."""
    monkeypatch.setenv(name, value)
    bi.case(run, capsys, registry, [], f"{run}: {message}")


def test_run_dir_not_writable(run, capsys, registry, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    bi.case(
        run,
        capsys,
        registry,
        [f'trainer.run_dir="{blocker / "run"}"'],
        f"trainer.run_dir: cannot write to {blocker} (Not a directory); make it writable or set "
        "another trainer.run_dir",
    )


def test_checkpoints_folder_not_writable(run, capsys, registry, tmp_path):
    """A run directory whose ``checkpoints/`` cannot take a new entry: refused before Ray, not
    at the first save minutes later."""
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    reason = "Permission denied" if os.geteuid() != 0 else "Operation not permitted"
    with bi.unwritable(checkpoints):
        bi.case(
            run,
            capsys,
            registry,
            [f'trainer.run_dir="{run_dir}"'],
            f"trainer.run_dir: cannot write to {checkpoints} ({reason}); make it writable or "
            "set another trainer.run_dir",
        )
