"""Catalogue of bad inputs: each is one exact line on stderr, exit code 2, no traceback.

Config errors go through ``rlcore config validate`` with the installed plugins. File errors
(model, tokenizer, data, resume path) go through :func:`rlcore.preflight.preflight`, the check
``rlcore train`` runs before Ray starts; once the CLI calls it, they go through ``rlcore
train`` itself (see ``_train_preflight``).
"""

from __future__ import annotations

import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest

import rlcore.cli
from rlcore.cli import main
from rlcore.config import load_config
from rlcore.errors import RlcoreError
from rlcore.plugins import PluginRegistry
from rlcore.preflight import preflight

REPO = Path(__file__).resolve().parents[1]
GSM8K_RAW = REPO / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"

CONFIG = """
[data]
train_files = "{data}/train.jsonl"
val_files = "{data}/val.jsonl"
train_batch_size = 4
max_prompt_length = 64
max_response_length = 16

[model]
path = "{model}"

[actor]
ppo_mini_batch_size = 2
micro_batch_size = 1

[rollout]
n = 2

[reward]
default = "gsm8k"

[algorithm]
name = "grpo"
"""


def row(i: int, **over) -> dict:
    r = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        "extra_info": {"index": i},
    }
    r.update(over)
    return r


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def registry():
    """The installed plugins minus the test-only fake distributions on pytest's pythonpath."""
    return PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])


@pytest.fixture(scope="module")
def registry_without_backends():
    """As a user sees it who installed neither rlcore-megatron nor rlcore-vllm (dev has both):
    the other first-party plugins, registered from their plugin modules."""
    import importlib

    reg = PluginRegistry(entry_points=False)
    for module in (
        "rlcore_fsdp2.plugin",
        "rlcore_hf.plugin",
        "rlcore_gsm8k.plugin",
        "rlcore_math.plugin",
        "rlcore_grpo.plugin",
        "rlcore_ppo.plugin",
        "rlcore_rloo.plugin",
    ):
        reg.register(importlib.import_module(module))
    return reg


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", hidden=64, heads=2, kv_heads=1
    )


@pytest.fixture
def run(tmp_path, tiny):
    """A valid run: config file, 8 train and 2 validation prompts, the tiny model."""
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "train.jsonl", [row(i) for i in range(8)])
    write_jsonl(data / "val.jsonl", [row(i) for i in range(2)])
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(data=data, model=tiny))
    return config


def _cli(argv: list[str], capsys, registry) -> tuple[int, str]:
    code = main(argv, registry=registry)
    return code, capsys.readouterr().err


def _train_preflight(config: Path, overrides: list[str], capsys, registry) -> tuple[int, str]:
    """``rlcore train``'s checks before Ray: through the CLI once it calls preflight."""
    if "preflight" in inspect.getsource(rlcore.cli):
        return _cli(["train", str(config), *overrides], capsys, registry)
    try:
        preflight(load_config(config, overrides, registry), registry=registry)
    except RlcoreError as err:  # rendered exactly as rlcore.cli.main renders it
        return 2, f"error: {err}\n"
    return 0, ""


def assert_one_line(code: int, err: str, expected: str) -> None:
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err == f"error: {expected}\n"
    assert code == 2


def test_the_base_run_is_valid(run, capsys, registry):
    assert _cli(["config", "validate", str(run)], capsys, registry) == (0, "")
    checked = preflight(load_config(run, registry=registry), registry=registry)
    assert (len(checked.train_set), len(checked.val_set)) == (8, 2)
    assert checked.tokenizer.chat_template


# --- configuration -----------------------------------------------------------------------------

# (overrides, message after "<config>: ")
CONFIG_CASES = [
    (["trainr.seed=1"], "trainr: unknown section (did you mean 'trainer'?)"),
    (
        ["actor.optim.learning_rate=1e-5"],
        "actor.optim.learning_rate: unknown key (did you mean 'lr'?)",
    ),
    (["rollout.temprature=0.5"], "rollout.temprature: unknown key (did you mean 'temperature'?)"),
    (['data.train_batch_size="8"'], 'data.train_batch_size: expected an integer, got "8"'),
    (["actor.optim.lr=-1"], "actor.optim.lr: must be > 0.0, got -1.0"),
    (["rollout.top_p=1.5"], "rollout.top_p: must be <= 1.0, got 1.5"),
    (
        ['model.dtype="fp8"'],
        'model.dtype: must be one of "float32", "bfloat16", "float16"; got "fp8"',
    ),
    (['resources.device="tpu"'], 'resources.device: must be one of "cpu", "cuda"; got "tpu"'),
    (
        ['trainer.loggers=["wandb"]'],
        "trainer.loggers: unknown logger 'wandb'; choose from console, jsonl, tensorboard",
    ),
    (["data.train_files=[]"], "data.train_files: must not be empty"),
    (
        ["actor.engine.name=fdsp2"],
        "actor.engine.name: unknown engine 'fdsp2'. Installed: fsdp2, megatron, torch. "
        "Did you mean 'fsdp2'?",
    ),
    (
        ["algorithm.name=grp"],
        "algorithm.name: unknown algorithm 'grp'. "
        "Installed: grpo, ppo, reinforce_plus_plus, rloo. Did you mean 'grpo'?",
    ),
    (
        ['reward.default="gsm9k"'],
        "reward.default: unknown reward 'gsm9k'. Installed: gsm8k, gsm8k_tool, math. "
        "Did you mean 'gsm8k'?",
    ),
    (
        ["actor.engine.reshard_after_foward=false"],
        "actor.engine.reshard_after_foward: unknown key (did you mean 'reshard_after_forward'?)",
    ),
    (["algorithm.epsilon=0"], "algorithm.epsilon: must be > 0.0, got 0.0"),
    (
        ["actor.max_tokens_per_micro_batch=4096"],
        "actor.max_tokens_per_micro_batch: set micro_batch_size or "
        "max_tokens_per_micro_batch, not both",
    ),
    (
        ["trainer.total_steps=10", "trainer.total_epochs=2"],
        "trainer.total_steps: set total_steps or total_epochs, not both",
    ),
    (
        ["reward.weights.math=1.0"],
        "reward.weights.math: reward 'math' is not selected by reward.default or reward.sources",
    ),
    (["actor.optim"], "override 'actor.optim': expected KEY=VALUE, e.g. actor.optim.lr=1e-5"),
    (["actor..lr=1"], "override 'actor..lr=1': 'actor..lr' is not a valid key path"),
    (["model.path.x=1"], "override 'model.path.x=1': model.path is not a table"),
]


@pytest.mark.parametrize(
    ("overrides", "message"), CONFIG_CASES, ids=[c[0][0] for c in CONFIG_CASES]
)
def test_config_error(run, capsys, registry, overrides, message):
    code, err = _cli(["config", "validate", str(run), *overrides], capsys, registry)
    assert_one_line(code, err, f"{run}: {message}")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor.engine.name=megatron"],
            "actor.engine.name: engine 'megatron' is not installed. "
            "Install it with: pip install rlcore-megatron",
        ),
        (
            ["rollout.name=vllm"],
            "rollout.name: rollout 'vllm' is not installed. "
            "Install it with: pip install rlcore-vllm",
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_first_party_plugin_not_installed(
    run, capsys, registry_without_backends, overrides, message
):
    code, err = _cli(
        ["config", "validate", str(run), *overrides], capsys, registry_without_backends
    )
    assert_one_line(code, err, f"{run}: {message}")


def test_missing_config_file(tmp_path, capsys, registry):
    code, err = _cli(["config", "validate", str(tmp_path / "nope.toml")], capsys, registry)
    assert_one_line(code, err, f"config file '{tmp_path / 'nope.toml'}' not found")


def test_toml_syntax_error(tmp_path, capsys, registry):
    bad = tmp_path / "bad.toml"
    bad.write_text('[data]\ntrain_files = "a.jsonl\n')
    code, err = _cli(["config", "validate", str(bad)], capsys, registry)
    assert_one_line(
        code, err, f"invalid TOML in {bad} at line 2, column 23: Illegal character '\\n'"
    )


def test_missing_required_section(tmp_path, capsys, registry):
    bad = tmp_path / "nomodel.toml"
    bad.write_text('[data]\ntrain_files = "a.jsonl"\n[reward]\ndefault = "gsm8k"\n')
    code, err = _cli(["config", "validate", str(bad)], capsys, registry)
    assert_one_line(code, err, f"{bad}: model.path: missing required key")


def test_debug_shows_the_traceback(run, capsys, registry_without_backends):
    argv = ["--debug", "config", "validate", str(run), "rollout.name=vllm"]
    assert main(argv, registry=registry_without_backends) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.endswith("Install it with: pip install rlcore-vllm\n")


# --- model, tokenizer, data, resume: checked before Ray starts -------------------------------


def data_dir(run: Path) -> Path:
    return run.parent / "data"


def _case(run: Path, capsys, registry, overrides: list[str], expected: str) -> None:
    code, err = _train_preflight(run, overrides, capsys, registry)
    assert_one_line(code, err, expected)


def test_missing_train_file(run, capsys, registry):
    missing = data_dir(run) / "nope.jsonl"
    _case(
        run,
        capsys,
        registry,
        [f'data.train_files="{missing}"'],
        f"data.train_files: data file {missing} does not exist",
    )


def test_missing_val_file(run, capsys, registry):
    missing = data_dir(run) / "val2.parquet"
    _case(
        run,
        capsys,
        registry,
        [f'data.val_files=["{missing}"]'],
        f"data.val_files: data file {missing} does not exist",
    )


def test_data_path_is_a_directory(run, capsys, registry):
    folder = data_dir(run)
    _case(
        run,
        capsys,
        registry,
        [f'data.train_files="{folder}"'],
        f"data.train_files: {folder} is not a file",
    )


def test_unsupported_extension(run, capsys, registry):
    csv = data_dir(run) / "train.csv"
    csv.write_text("prompt,answer\n1+1,2\n")
    _case(
        run,
        capsys,
        registry,
        [f'data.train_files="{csv}"'],
        f"data.train_files: data file {csv}: unsupported extension '.csv' (use .parquet or .jsonl)",
    )


def test_corrupt_parquet(run, capsys, registry):
    bad = data_dir(run) / "train.parquet"
    bad.write_bytes(b"this is not parquet at all")
    code, err = _train_preflight(run, [f'data.train_files="{bad}"'], capsys, registry)
    # pyarrow's own reason follows; the start names the key and the file.
    assert err.startswith(f"error: data.train_files: cannot read parquet file {bad}: ")
    assert_one_line(code, err, err.removeprefix("error: ").removesuffix("\n"))


def test_invalid_json_line(run, capsys, registry):
    bad = data_dir(run) / "train.jsonl"
    bad.write_text(json.dumps(row(0)) + "\n{not json\n")
    _case(
        run,
        capsys,
        registry,
        [],
        f"data.train_files: {bad}:2: not a JSON object per line: Expecting property name "
        "enclosed in double quotes",
    )


def test_not_utf8(run, capsys, registry):
    bad = data_dir(run) / "train.jsonl"
    bad.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    _case(
        run,
        capsys,
        registry,
        [],
        f"data.train_files: {bad} is not UTF-8 text (invalid start byte at byte 12)",
    )


def test_empty_data_file(run, capsys, registry):
    empty = data_dir(run) / "train.jsonl"
    empty.write_text("")
    _case(run, capsys, registry, [], f"data.train_files: data file {empty} has no rows")


def test_missing_data_source_column(run, capsys, registry):
    file = data_dir(run) / "train.jsonl"
    rows = [row(i) for i in range(8)]
    del rows[3]["data_source"]
    write_jsonl(file, rows)
    _case(
        run,
        capsys,
        registry,
        [],
        f"data.train_files: {file} row 3: missing required column 'data_source'",
    )


def test_missing_ground_truth(run, capsys, registry):
    file = data_dir(run) / "val.jsonl"
    write_jsonl(file, [row(0, reward_model={"style": "rule"})])
    _case(
        run,
        capsys,
        registry,
        [],
        f"data.val_files: {file} row 0: missing required column 'reward_model.ground_truth'",
    )


def test_wrong_prompt_key(run, capsys, registry):
    file = data_dir(run) / "train.jsonl"
    _case(
        run,
        capsys,
        registry,
        ['data.prompt_key="question"'],
        f"data.train_files: {file} row 0: missing required column 'question'",
    )


@pytest.mark.skipif(not GSM8K_RAW.is_file(), reason="real data not found at ../shared/data")
def test_raw_gsm8k_file_without_preparation(run, capsys, registry):
    """The untouched GSM8K file (question/answer) instead of the prepared verl schema."""
    file = GSM8K_RAW.resolve()
    _case(
        run,
        capsys,
        registry,
        [f'data.train_files="{file}"'],
        f"data.train_files: {file} row 0: missing required column 'prompt'",
    )


def test_all_prompts_longer_than_the_limit(run, capsys, registry):
    file = data_dir(run) / "train.jsonl"
    _case(
        run,
        capsys,
        registry,
        ["data.max_prompt_length=8"],
        f"data.train_files: all 8 prompts in {file} are longer than max_prompt_length=8 tokens; "
        "raise max_prompt_length",
    )


def test_overlong_prompts_without_filtering(run, capsys, registry):
    file = data_dir(run) / "train.jsonl"
    _case(
        run,
        capsys,
        registry,
        ["data.max_prompt_length=8", "data.filter_overlong_prompts=false"],
        f"data.train_files: {file} row 0: prompt has 33 tokens, more than max_prompt_length=8 "
        "(8 such rows); set filter_overlong_prompts = true, raise max_prompt_length, or choose "
        "a truncation",
    )


def test_overlong_prompts_are_filtered_with_a_logged_count(run, caplog, registry):
    file = data_dir(run) / "train.jsonl"
    rows = [row(i) for i in range(8)]
    rows[5]["prompt"] = [{"role": "user", "content": "x" * 100}]
    write_jsonl(file, rows)
    with caplog.at_level("WARNING", logger="rlcore.data.dataset"):
        preflight(load_config(run, registry=registry), registry=registry)
    assert "filtered 1 of 8 prompts longer than 64 tokens from train.jsonl" in caplog.text


def test_fewer_prompts_than_one_batch(run, capsys, registry):
    write_jsonl(data_dir(run) / "train.jsonl", [row(0), row(1), row(2)])
    _case(
        run,
        capsys,
        registry,
        [],
        "data.train_batch_size: the train set has 3 prompts (after filtering), fewer than one "
        "batch of 4; lower it or add data",
    )


def test_chat_messages_without_chat_template(run, capsys, registry):
    file = data_dir(run) / "train.jsonl"
    _case(
        run,
        capsys,
        registry,
        ["data.apply_chat_template=false"],
        f"data.train_files: {file} row 0: column 'prompt' holds chat messages but "
        "apply_chat_template is false; give plain strings or enable the template",
    )


def test_model_path_missing(run, capsys, registry, tmp_path):
    missing = tmp_path / "no-model"
    _case(
        run,
        capsys,
        registry,
        [f'model.path="{missing}"'],
        f"model.path: {missing} does not exist; give a local Hugging Face model folder",
    )


def test_model_path_without_weights(run, capsys, registry, tmp_path, tiny):
    folder = tmp_path / "noweights"
    shutil.copytree(tiny, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    _case(
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
    _case(
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
    _case(
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
    _case(
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
    _case(
        run,
        capsys,
        registry,
        ["algorithm.name=ppo", f'critic.model_path="{folder}"'],
        f"critic.model_path: {folder} has no weights (*.safetensors or pytorch_model*.bin); "
        "download or save the model there",
    )


def test_resume_path_missing(run, capsys, registry, tmp_path):
    missing = tmp_path / "runs" / "old"
    _case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{missing}"'],
        f"trainer.resume: checkpoint {missing} does not exist",
    )


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


def _checkpoint(run_dir: Path, step: int, model: Path) -> Path:
    """A ``global_step_<step>`` laid out as the trainer writes it (DCP actor/, state, config)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from rlcore.checkpoint import CheckpointManager, save_driver_state

    def write(tmp: Path) -> None:
        dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp / "actor"), no_dist=True)
        save_driver_state(tmp, step=step, dataloader_state={"epoch": 0})
        (tmp / "config.toml").write_text(f'[model]\npath = "{model}"\n')

    return CheckpointManager(run_dir / "checkpoints").save(step, write)


def _craft(step_dir: Path, marker: Path) -> Path:
    import pickle

    from rlcore.safe_checkpoint import write_manifest

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
    step = _checkpoint(tmp_path / "run", 1, tiny)
    marker = tmp_path / "pwned"
    meta = _craft(step, marker)
    argv = ["export", str(step), "--format", "hf", str(tmp_path / "out")]
    code, err = _cli(argv, capsys, registry)
    assert_one_line(code, err, _refusal(meta))
    code, err = _cli(["export", str(tmp_path / "run"), str(tmp_path / "out")], capsys, registry)
    assert_one_line(code, err, _refusal(meta))
    assert not marker.exists()
    assert not (tmp_path / "out").exists()


def test_resume_refuses_crafted_metadata(run, tmp_path, capsys, registry, tiny):
    step = _checkpoint(tmp_path / "old", 1, tiny)
    marker = tmp_path / "pwned"
    meta = _craft(step, marker)
    code, err = _train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    assert_one_line(code, err, f"trainer.resume: {_refusal(meta)}")
    # trainer.resume = "auto" on the run directory holding it: refused as well, before Ray.
    code, err = _train_preflight(run, [f'trainer.run_dir="{tmp_path / "old"}"'], capsys, registry)
    assert_one_line(code, err, _refusal(meta))
    assert not marker.exists()


def test_resume_from_a_checkpoint_missing_a_shard(run, tmp_path, capsys, registry, tiny):
    step = _checkpoint(tmp_path / "old", 1, tiny)
    shard = step / "actor" / "__0_0.distcp"
    shard.unlink()
    code, err = _train_preflight(run, [f'trainer.resume="{step}"'], capsys, registry)
    assert_one_line(
        code,
        err,
        f"trainer.resume: checkpoint {step} is damaged: {shard} is missing (listed in "
        "MANIFEST.json); use an earlier one",
    )
    code, err = _train_preflight(run, [f'trainer.run_dir="{tmp_path / "old"}"'], capsys, registry)
    assert_one_line(
        code,
        err,
        f"no intact checkpoint under {tmp_path / 'old' / 'checkpoints'} (global_step_1: {shard} "
        "is missing (listed in MANIFEST.json)); remove the damaged ones or set trainer.resume = "
        '"off" to start over',
    )


# --- model files, rows, seeds, environment, run dir (issue 15): checked before Ray ----------


def _model_copy(tiny: Path, dest: Path) -> Path:
    shutil.copytree(tiny, dest)
    return dest


def _weights(folder: Path) -> Path:
    return next(folder.glob("*.safetensors"))


def test_zero_byte_weights(run, capsys, registry, tmp_path, tiny):
    folder = _model_copy(tiny, tmp_path / "m")
    weights = _weights(folder)
    weights.write_bytes(b"")
    _case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {weights} is not a complete safetensors file (0 bytes); download or save "
        "the model again",
    )


def test_truncated_weights(run, capsys, registry, tmp_path, tiny):
    folder = _model_copy(tiny, tmp_path / "m")
    weights = _weights(folder)
    full = weights.read_bytes()
    weights.write_bytes(full[: len(full) // 2])
    _case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {weights} is truncated ({len(full) // 2} bytes, its header describes "
        f"{len(full)}); download or save the model again",
    )


def test_empty_model_config(run, capsys, registry, tmp_path, tiny):
    folder = _model_copy(tiny, tmp_path / "m")
    (folder / "config.json").write_text("{}")
    _case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: {folder / 'config.json'} names no model_type; it is not a transformers "
        "model config",
    )


def test_config_shapes_do_not_match_the_weights(run, capsys, registry, tmp_path, tiny):
    folder = _model_copy(tiny, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    cfg["hidden_size"] = hidden * 2
    (folder / "config.json").write_text(json.dumps(cfg))
    _case(
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

    folder = _model_copy(tiny, tmp_path / "m")
    weights = _weights(folder)
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
    _case(
        run,
        capsys,
        registry,
        [f'model.path="{folder}"'],
        f"model.path: the model's vocab_size ({small}) is smaller than the tokenizer's "
        f"{n_tokens} tokens; use the tokenizer saved with this model (model.tokenizer_path)",
    )


def test_every_prompt_empty_without_chat_template(run, capsys, registry):
    file = data_dir(run) / "train.jsonl"
    write_jsonl(file, [row(i, prompt="") for i in range(8)])
    _case(
        run,
        capsys,
        registry,
        ["data.apply_chat_template=false"],
        f"data.train_files: {file} row 0: column 'prompt' is an empty prompt; remove the row "
        "or write the prompt",
    )


CHAT_CASES = [
    ([], "is an empty list of messages; give at least one message"),
    ([{"role": "user", "content": 5}], "message 0: content must be a string, got 5"),
    ([{"role": "user", "content": None}], "message 0: content must be a string, got null"),
    ([{"role": 7, "content": "hi"}], "message 0: role must be a string, got 7"),
]


@pytest.mark.parametrize(("prompt", "message"), CHAT_CASES, ids=["[]", "5", "null", "role7"])
def test_bad_chat_messages(run, capsys, registry, prompt, message):
    file = data_dir(run) / "train.jsonl"
    rows = [row(i) for i in range(8)]
    rows[2]["prompt"] = prompt
    write_jsonl(file, rows)
    _case(run, capsys, registry, [], f"data.train_files: {file} row 2: column 'prompt' {message}")


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [("data.seed=-1", "data.seed", -1), (f"trainer.seed={2**64}", "trainer.seed", 2**64)],
    ids=["data.seed=-1", "trainer.seed=2**64"],
)
def test_seed_out_of_range(run, capsys, registry, override, key, value):
    _case(
        run,
        capsys,
        registry,
        [override],
        f"{key}: must be between 0 and 2**32 - 1 (4294967295), got {value}",
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "RLCORE_COLLECTIVE_TIMEOUT_S",
            "abc",
            "RLCORE_COLLECTIVE_TIMEOUT_S='abc': expected a positive number of seconds",
        ),
        (
            "RLCORE_MAX_GRAD_NORM",
            "abc",
            "RLCORE_MAX_GRAD_NORM='abc': expected a positive number (the gradient-norm "
            "ceiling); unset it for none",
        ),
        (
            "RLCORE_NUM_THREADS",
            "two",
            "RLCORE_NUM_THREADS='two': expected a whole number of threads >= 1",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("RLCORE") else None,
)
def test_bad_environment_variable(run, capsys, registry, monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    _case(run, capsys, registry, [], message)


def test_run_dir_not_writable(run, capsys, registry, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    _case(
        run,
        capsys,
        registry,
        [f'trainer.run_dir="{blocker / "run"}"'],
        f"trainer.run_dir: cannot write to {blocker} (Not a directory); make it writable or set "
        "another trainer.run_dir",
    )


# --- resume with changed settings (issue 15): refused, naming the keys ------------------------


def _checkpoint_of(run: Path, registry, run_dir: Path) -> Path:
    """A checkpoint whose config.toml is ``run``'s resolved config, as the trainer writes it."""
    from rlcore.config import config_to_dict, dump_toml

    step = _checkpoint(run_dir, 1, Path("unused"))
    text = dump_toml(config_to_dict(load_config(run, registry=registry)))
    (step / "config.toml").write_text(text)
    from rlcore.safe_checkpoint import write_manifest

    write_manifest(step)
    return step


def test_resume_with_another_learning_rate(run, capsys, registry, tmp_path):
    step = _checkpoint_of(run, registry, tmp_path / "old")
    lr = load_config(run, registry=registry).actor.optim.lr
    _case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{step}"', "actor.optim.lr=0.5"],
        f"trainer.resume: checkpoint {step} was trained with other settings: actor.optim.lr "
        f"(checkpoint {lr}, now 0.5); restore them, or start a new trainer.run_dir from its "
        "weights (rlcore export, then model.path)",
    )


def test_resume_with_another_model(run, capsys, registry, tmp_path, tiny):
    step = _checkpoint_of(run, registry, tmp_path / "old")
    other = _model_copy(tiny, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-3
    (other / "config.json").write_text(json.dumps(cfg))
    _case(
        run,
        capsys,
        registry,
        [f'trainer.resume="{step}"', f'model.path="{other}"'],
        f"trainer.resume: checkpoint {step} was trained with other settings: model.path "
        f"(checkpoint {tiny}, now {other}); restore them, or start a new trainer.run_dir from "
        "its weights (rlcore export, then model.path)",
    )
    # The same model moved elsewhere resumes (preflight passes; nothing is trained here).
    moved = _model_copy(tiny, tmp_path / "moved")
    overrides = [f'trainer.resume="{step}"', f'model.path="{moved}"']
    preflight(load_config(run, overrides, registry), registry=registry)


# --- rlcore export: checked before the model loads (issue 15) ---------------------------------


def _fsdp2_like_checkpoint(run_dir: Path, model: Path) -> Path:
    """A checkpoint whose actor/ holds ``model``'s weights under DCP's ``model.`` names."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from rlcore.checkpoint import CheckpointManager, save_driver_state

    weights = load_file(_weights(model))

    def write(tmp: Path) -> None:
        dcp.save({"model": weights}, checkpoint_id=str(tmp / "actor"), no_dist=True)
        save_driver_state(tmp, step=1, dataloader_state={"epoch": 0})
        (tmp / "config.toml").write_text(f'[model]\npath = "{model}"\n')

    return CheckpointManager(run_dir / "checkpoints").save(1, write)


def test_export_with_a_model_path_of_another_shape(capsys, registry, tmp_path, tiny):
    from rlcore.testing.tiny_model import build_tiny_model

    step = _fsdp2_like_checkpoint(tmp_path / "run", tiny)
    other = build_tiny_model(tmp_path / "other", hidden=96, heads=3, kv_heads=1)
    capsys.readouterr()  # the build's progress bars
    argv = ["export", str(step), str(tmp_path / "out"), "--model-path", str(other)]
    code, err = _cli(argv, capsys, registry)
    assert_one_line(
        code,
        err,
        f"model {other} does not fit checkpoint {step / 'actor'}: lm_head.weight has shape "
        f"[{json.loads((other / 'config.json').read_text())['vocab_size']}, 96] in "
        f"{_weights(other)} but [{json.loads((tiny / 'config.json').read_text())['vocab_size']}"
        ", 64] in the checkpoint; pass the run's base model with --model-path",
    )


def test_export_into_an_unwritable_place(capsys, registry, tmp_path, tiny):
    step = _fsdp2_like_checkpoint(tmp_path / "run", tiny)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "hf"
    code, err = _cli(["export", str(step), str(out)], capsys, registry)
    assert_one_line(code, err, f"cannot write {out} (Not a directory); choose a writable OUT")


def test_a_system_exit_during_training_is_one_line(run, capsys, registry, monkeypatch, tmp_path):
    """Something in the driver (an in-driver reward, a plugin) calls ``sys.exit``: one line
    naming where, exit 2, instead of a silent exit 3. Ray and training are stubbed out: the
    preflight and the CLI's handling are real."""
    import rlcore.ray_utils
    import rlcore.trainer

    def exits(config, prepared):
        sys.exit(3)

    monkeypatch.setattr(rlcore.trainer, "run_training", exits)
    monkeypatch.setattr(rlcore.ray_utils, "start_ray", lambda resources: False)
    run_dir = tmp_path / "r"
    code, err = _cli(["train", str(run), f'trainer.run_dir="{run_dir}"'], capsys, registry)
    line = exits.__code__.co_firstlineno + 1
    assert_one_line(
        code,
        err,
        f"training stopped: SystemExit(3) raised in exits ({__file__}:{line}); no checkpoint "
        "saved yet; a new run starts from step 0",
    )
    assert (run_dir / ".rlcore.lock").read_text() != ""  # the lock was taken, then freed
    from rlcore.runlock import acquire_run_lock

    acquire_run_lock(run_dir).release()
