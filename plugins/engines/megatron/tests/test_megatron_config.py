"""``[actor.engine]`` options of the megatron engine as a user writes them (no model built)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlcore.config import ConfigValidationError, load_config_text
from rlcore.testing.runs import tiny_run_toml
from rlcore_megatron.engine import LORA_UNSUPPORTED, MegatronEngine


def _toml(tmp_path, engine_lines: str) -> str:
    return tiny_run_toml(
        model=tmp_path / "model",
        train_files=[tmp_path / "train.jsonl"],
        run_dir=tmp_path / "run",
        processes_per_node=2,
        extra=f'[actor.engine]\nname = "megatron"\ntensor_parallel = 2\n{engine_lines}',
    )


@pytest.mark.parametrize(
    ("lines", "key"),
    [
        ("lora_rank = 8\n", "lora_rank"),
        # fsdp2's usual pair, in the other order: still one line, on the first LoRA field
        ("lora_alpha = 32\nlora_rank = 8\n", "lora_rank"),
        ('target_modules = ["q_proj"]\n', "target_modules"),
    ],
)
def test_lora_options_are_one_key_path_line(tmp_path, lines, key):
    with pytest.raises(ConfigValidationError) as err:
        load_config_text(_toml(tmp_path, lines))
    assert str(err.value) == f"<string>: actor.engine.{key}: {LORA_UNSUPPORTED}"
    assert "not supported in rlcore-megatron" in LORA_UNSUPPORTED
    assert 'name = "fsdp2"' in LORA_UNSUPPORTED


def test_lora_off_values_are_accepted(tmp_path):
    config = load_config_text(_toml(tmp_path, "lora_rank = 0\n"))
    assert config.actor.engine.name == "megatron"
    assert MegatronEngine.Config(lora_rank=0).tensor_parallel == 1
    with pytest.raises(ValueError, match="LoRA is not supported in rlcore-megatron"):
        MegatronEngine.Config(lora_rank=4)


def test_rlcore_train_with_lora_prints_one_line(tmp_path):
    config = tmp_path / "lora.toml"
    config.write_text(_toml(tmp_path, "lora_rank = 8\nlora_alpha = 16\n"))
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "train", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {config}: actor.engine.lora_rank: {LORA_UNSUPPORTED}"]
