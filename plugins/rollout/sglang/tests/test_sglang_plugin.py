"""The parts of the SGLang rollout that run without SGLang or a GPU (what CI can check).

``check_rollout`` needs a running engine, so only its ``Config`` rules run here, with the
plugin-module check; the engine path runs in ``scripts/gpu_check.sh`` where SGLang and a GPU
exist.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from rlcore.config.convert import render_path, structure
from rlcore.errors import ConfigError
from rlcore.interfaces import RolloutSpec
from rlcore.testing.conformance import check_config, check_plugin_module
from rlcore.testing.tiny_model import build_tiny_model
from rlcore_sglang.rollout import (
    INSTALL_HINT,
    SGLangRollout,
    missing_requirement,
    special_token_ids,
)

SGLANG_ABSENT = importlib.util.find_spec("sglang") is None
needs_no_sglang = pytest.mark.skipif(not SGLANG_ABSENT, reason="SGLang is installed here")


def _problems(table):
    _, problems = structure(table, SGLangRollout.Config, ("rollout",))
    return [f"{render_path(p)}: {m}" for p, m in problems]


def test_plugin_module_is_light_and_registers_sglang():
    assert check_plugin_module("rlcore_sglang.plugin") == {
        "rollout/sglang": "rlcore_sglang.rollout:SGLangRollout"
    }


def test_rollout_module_imports_without_sglang():
    # The registry imports rlcore_sglang.rollout when a config selects it (config validate):
    # SGLang must load only when the rollout is built.
    code = "import sys, rlcore_sglang.rollout; print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_rules():
    defaults = check_config(SGLangRollout, None, "rollout")
    assert defaults == SGLangRollout.Config()
    assert (defaults.tensor_parallel_size, defaults.gpu_memory_utilization) == (1, 0.5)


def test_config_errors_name_the_key_path():
    assert _problems({"tensor_parallel_size": 0}) == [
        "rollout.tensor_parallel_size: must be >= 1, got 0"
    ]
    assert _problems({"gpu_memory_utilization": 1.5}) == [
        "rollout.gpu_memory_utilization: must be <= 1.0, got 1.5"
    ]
    assert _problems({"tensor_paralel_size": 2})[0].startswith(
        "rollout.tensor_paralel_size: unknown key (did you mean 'tensor_parallel_size'?)"
    )
    (clash,) = _problems({"server_args": {"tp_size": 2, "disable_radix_cache": True}})
    assert clash.startswith("rollout.server_args: ")
    assert "tp_size (set from rollout.tensor_parallel_size)" in clash


def test_server_kwargs_map_the_run_onto_server_args():
    spec = RolloutSpec(model_path="/m", dtype="bfloat16", seed=1003, trust_remote_code=True)
    config = SGLangRollout.Config(
        tensor_parallel_size=2,
        gpu_memory_utilization=0.4,
        deterministic=True,
        server_args={"disable_radix_cache": True, "context_length": 4096},
    )
    assert SGLangRollout.server_kwargs(spec, config, base_gpu_id=3) == {
        "model_path": "/m",
        "tokenizer_path": "/m",
        "dtype": "bfloat16",
        "trust_remote_code": True,
        "tp_size": 2,
        "mem_fraction_static": 0.4,
        "enable_memory_saver": True,
        "enable_deterministic_inference": True,
        "random_seed": 1003,
        "base_gpu_id": 3,
        "log_level": "error",
        "sampling_defaults": "openai",
        "disable_radix_cache": True,
        "context_length": 4096,
    }


def test_missing_requirement_lines():
    base = {"device": "cuda", "visible_gpus": 1, "tensor_parallel_size": 1}
    assert missing_requirement(sglang_installed=True, **base) is None
    line = missing_requirement(sglang_installed=False, **base)
    assert line == f"rollout 'sglang' needs SGLang, which is not installed: {INSTALL_HINT}"
    assert "pip install 'rlcore-sglang[engine]'" in line
    assert "\n" not in line
    cpu = missing_requirement(sglang_installed=True, **{**base, "device": "cpu"})
    assert cpu is not None
    assert "needs a CUDA GPU but [resources] device = 'cpu'" in cpu
    few = missing_requirement(sglang_installed=True, **{**base, "tensor_parallel_size": 2})
    assert few == (
        "rollout 'sglang' needs 2 CUDA GPU(s) (rollout.tensor_parallel_size) in this process, "
        "torch sees 1"
    )


@needs_no_sglang
def test_building_without_sglang_is_one_line(tmp_path):
    spec = RolloutSpec(model_path=str(tmp_path), device="cuda")
    with pytest.raises(ConfigError) as info:
        SGLangRollout(spec)
    assert str(info.value) == (
        f"rollout 'sglang' needs SGLang, which is not installed: {INSTALL_HINT}"
    )


def test_special_token_ids_match_what_check_rollout_counts_as_eos(tmp_path):
    from rlcore.testing.conformance._rollout import _eos_ids

    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=1, kv_heads=1)
    eos, pad = special_token_ids(RolloutSpec(model_path=str(path)))
    assert set(eos) == _eos_ids(str(path))
    assert isinstance(pad, int)


# --- the command line, with the plugin installed and SGLang absent -------------------------

CONFIG = """
[data]
train_files = "train.jsonl"
train_batch_size = 4

[model]
path = "/models/tiny"

[actor.engine]
name = "fsdp2"

[rollout]
name = "sglang"
n = 4
tensor_parallel_size = {tp}
gpu_memory_utilization = 0.6
server_args = {{ disable_radix_cache = true }}

[reward]
default = "gsm8k"

[algorithm]
name = "grpo"

[resources]
device = "cuda"
"""


def _rlcore(*args):
    return subprocess.run(
        [sys.executable, "-m", "rlcore.cli", *args], capture_output=True, text=True, timeout=120
    )


@needs_no_sglang
def test_cli_plugins_and_config_validate_without_sglang(tmp_path):
    listed = _rlcore("plugins")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert ["rollout", "sglang", "rlcore-sglang", "0.1.0", "ok"] in rows

    good = tmp_path / "run.toml"
    good.write_text(CONFIG.format(tp=1))
    ok = _rlcore("config", "validate", str(good))
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"ok: {good} is valid\n", "")

    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.format(tp=0))
    err = _rlcore("config", "validate", str(bad))
    assert err.returncode == 2
    assert "rollout.tensor_parallel_size: must be >= 1, got 0" in err.stderr
    assert "Traceback" not in err.stderr
