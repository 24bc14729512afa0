"""Shared pieces of the bad-input catalogue (``test_bad_inputs_*.py``): a valid tiny run,
the plugin registries, and the one-line assertion every case uses.

Each case is one exact line on stderr, exit code 2, no traceback. Config errors go through
``rlcore config validate``; file errors (model, tokenizer, data, resume path) through ``rlcore
train``, which runs :func:`rlcore.preflight.preflight` before Ray starts.

The test modules bind the fixtures below by name (``run = bi.run``): pytest finds a fixture
through the module that uses it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.plugins import PluginRegistry

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


def cli(argv: list[str], capsys, registry) -> tuple[int, str]:
    code = main(argv, registry=registry)
    return code, capsys.readouterr().err


def train_preflight(config: Path, overrides: list[str], capsys, registry) -> tuple[int, str]:
    """``rlcore train`` on a config its checks before Ray refuse."""
    return cli(["train", str(config), *overrides], capsys, registry)


def assert_one_line(code: int, err: str, expected: str) -> None:
    assert "Traceback" not in err
    assert err.count("\n") == 1, err
    assert err == f"error: {expected}\n"
    assert code == 2


def data_dir(run: Path) -> Path:
    return run.parent / "data"


def case(run: Path, capsys, registry, overrides: list[str], expected: str) -> None:
    code, err = train_preflight(run, overrides, capsys, registry)
    assert_one_line(code, err, expected)


def model_copy(tiny: Path, dest: Path) -> Path:
    shutil.copytree(tiny, dest)
    return dest


def weights_file(folder: Path) -> Path:
    return next(folder.glob("*.safetensors"))


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """``folder`` refuses new entries while inside: mode 0o555, or for root (whom modes do not
    stop) the immutable attribute (``chattr +i``); skips where neither is possible."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: cannot make a folder unwritable")
    done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"chattr +i {folder} failed: {done.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def checkpoint(run_dir: Path, step: int, model: Path) -> Path:
    """A ``global_step_<step>`` laid out as the trainer writes it (DCP actor/, state, config)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from rlcore.checkpoint import CheckpointManager, save_driver_state

    def write(tmp: Path) -> None:
        dcp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp / "actor"), no_dist=True)
        save_driver_state(tmp, step=step, dataloader_state={"epoch": 0})
        (tmp / "config.toml").write_text(f'[model]\npath = "{model}"\n')

    return CheckpointManager(run_dir / "checkpoints").save(step, write)


def checkpoint_of(run: Path, registry, run_dir: Path, overrides: list[str] | None = None) -> Path:
    """A checkpoint whose config.toml is ``run``'s resolved config (with ``overrides``), as
    the trainer writes it."""
    from rlcore.config import config_to_dict, dump_toml, load_config

    step = checkpoint(run_dir, 1, Path("unused"))
    text = dump_toml(config_to_dict(load_config(run, overrides or [], registry=registry)))
    (step / "config.toml").write_text(text)
    from rlcore.checkpoint.safe_load import write_manifest

    write_manifest(step)
    return step


def fsdp2_like_checkpoint(run_dir: Path, model: Path) -> Path:
    """A checkpoint whose actor/ holds ``model``'s weights under DCP's ``model.`` names."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from rlcore.checkpoint import CheckpointManager, save_driver_state

    weights = load_file(weights_file(model))

    def write(tmp: Path) -> None:
        dcp.save({"model": weights}, checkpoint_id=str(tmp / "actor"), no_dist=True)
        save_driver_state(tmp, step=1, dataloader_state={"epoch": 0})
        (tmp / "config.toml").write_text(f'[model]\npath = "{model}"\n')

    return CheckpointManager(run_dir / "checkpoints").save(1, write)
