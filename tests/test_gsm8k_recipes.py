"""examples/gsm8k's GPU recipes: every key checked by rlcore, the memory per GPU computed right.

The recipes go through the real ``rlcore config validate`` and the plugins' own pre-Ray checks
(tensor parallelism against the processes). ``examples/gsm8k/memory.py`` is checked three
ways: parameter counts by hand and against transformers' own model (built on the meta
device, no weights), the per-layer activation bytes against what autograd really saves in a
Qwen2 layer under rlcore's packed attention (CPU, bf16), and the rows of the 7B recipe by
hand. No GPU here: the tables are computed, not measured.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from rlcore import cli
from rlcore.config import load_config
from rlcore.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gsm8k"
CONFIGS = EXAMPLE / "model_configs"
SMALL = EXAMPLE / "grpo.toml"  # Qwen2.5-0.5B-Instruct, one GPU
LARGE = EXAMPLE / "grpo_7b_8gpu.toml"  # Qwen2.5-7B-Instruct, eight GPUs
SMALL_JSON = CONFIGS / "Qwen2.5-0.5B-Instruct.json"
LARGE_JSON = CONFIGS / "Qwen2.5-7B-Instruct.json"
GIB = 1 << 30


@pytest.fixture(scope="module")
def memory():
    spec = importlib.util.spec_from_file_location("gsm8k_memory", EXAMPLE / "memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(memory, recipe: Path, model_json: Path, *overrides: str, device_gib: float = 0.0):
    config, shape = memory.load(str(recipe), str(model_json), list(overrides))
    gib = device_gib or memory.DEFAULT_DEVICE_GIB
    return memory.estimate(config, shape, int(gib * GIB))


def _row(report, phase: str, name: str) -> int:
    (found,) = [p for p in report.phases if p.name == phase]
    (row,) = [r for r in found.rows if r.name == name]
    return row.bytes


# --- every key validated ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grpo.toml", "grpo_7b_8gpu.toml", "ppo.toml", "rloo.toml"])
def test_the_gpu_recipes_pass_rlcore_config_validate(name, capsys):
    path = EXAMPLE / name
    assert cli.main(["config", "validate", str(path)]) == 0
    assert capsys.readouterr().out.strip() == f"ok: {path} is valid"


def test_validate_refuses_a_misspelled_vllm_key_of_the_7b_recipe(capsys):
    # The rollout plugin's own keys are checked too (rlcore-vllm's Config, vLLM not imported).
    argv = ["config", "validate", str(LARGE), "rollout.tensor_parallel_sizee=2"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    expected = "rollout.tensor_parallel_sizee: unknown key (did you mean 'tensor_parallel_size'?)"
    assert expected in err


def test_the_7b_recipe_passes_the_plugins_checks_before_ray():
    from rlcore.trainer.plugin_checks import check_plugins

    config = load_config(LARGE)
    assert config.resources.processes_per_node == 8
    assert config.rollout.options.tensor_parallel_size == 2
    assert config.actor.engine.options.fsdp_size == -1  # shards over all eight
    check_plugins(config)  # tensor_parallel_size 2 divides the 8 policy workers
    with pytest.raises(ConfigError, match=r"tensor_parallel_size = 3 must divide"):
        check_plugins(load_config(LARGE, ["rollout.tensor_parallel_size=3"]))


# --- parameters ---------------------------------------------------------------------------


def test_parameter_counts_by_hand(memory):
    # Qwen2.5-0.5B: q/k/v with bias, o without; SwiGLU; two RMSNorms a layer; tied lm_head.
    h, kv, inter, vocab = 896, 2 * 64, 4864, 151936
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    assert vocab * h + 24 * layer + h == 494_032_768
    assert memory.ModelShape.read(SMALL_JSON).parameters == 494_032_768
    # Qwen2.5-7B: 28 heads of 128, 4 KV heads, untied lm_head.
    h, kv, inter, vocab = 3584, 4 * 128, 18944, 152064
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    assert 2 * vocab * h + 28 * layer + h == 7_615_616_512
    assert memory.ModelShape.read(LARGE_JSON).parameters == 7_615_616_512


@pytest.mark.parametrize("model_json", [SMALL_JSON, LARGE_JSON], ids=["0.5b", "7b"])
def test_parameter_counts_equal_transformers_model(memory, model_json):
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.for_model(**json.loads(model_json.read_text()))
    with torch.device("meta"):  # shapes only: no memory, no weights
        model = AutoModelForCausalLM.from_config(hf_config)
    shape = memory.ModelShape.read(model_json)
    assert sum(p.numel() for p in model.parameters()) == shape.parameters
    assert sum(p.numel() for p in model.model.layers[0].parameters()) == shape.layer
    assert shape.largest_tensor == model.model.embed_tokens.weight.numel()


# --- activations: what autograd really keeps ----------------------------------------------


def _saved_bytes_per_token(layers: int, *, checkpointing: bool, tokens: int = 64) -> float:
    """Bytes of the tensors autograd saves in a tiny Qwen2 under rlcore's packed attention."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rlcore_fsdp2 import packing

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=160,
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(
        config,
        dtype=torch.bfloat16,
        attn_implementation=packing.attention_for_packing("sdpa"),
    )
    if checkpointing:  # as rlcore_fsdp2.engine._load_model turns it on
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()
    weights = {p.data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights:  # one entry per storage: views share it
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 97, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, position_ids=torch.arange(tokens)[None], use_cache=False)
    return sum(storages.values()) / tokens


def test_layer_activation_bytes_equal_what_autograd_saves(memory):
    # One layer more, everything else the same: the difference is one layer's saved tensors.
    per_layer = _saved_bytes_per_token(2, checkpointing=False) - _saved_bytes_per_token(
        1, checkpointing=False
    )
    shape = memory.ModelShape.from_config(
        {
            "model_type": "qwen2",
            "vocab_size": 97,
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 160,
            "tie_word_embeddings": True,
        }
    )
    assert per_layer == memory.layer_activation_bytes(shape, 2) == 2840
    # Gradient checkpointing keeps each layer's bf16 input only: hidden x 2 bytes.
    kept = _saved_bytes_per_token(2, checkpointing=True) - _saved_bytes_per_token(
        1, checkpointing=True
    )
    assert kept == 64 * 2


# --- the 7B recipe on eight 80 GiB GPUs -----------------------------------------------------


def test_7b_rows_by_hand(memory):
    report = _report(memory, LARGE, LARGE_JSON)
    p = 7_615_616_512
    device = int(memory.DEFAULT_DEVICE_GIB * GIB)
    backward = "backward: logits"
    assert _row(report, backward, "actor parameters") == p * 4 // 8  # float32 master / 8
    assert _row(report, backward, "actor gradients") == p * 4 // 8
    assert _row(report, backward, "AdamW exp_avg + exp_avg_sq") == 2 * (p * 4 // 8)
    assert _row(report, backward, "reference parameters") == p * 2 // 8  # bf16 / 8
    assert _row(report, backward, "logits (+ their gradient)") == 2 * 24000 * 152064 * 2
    assert _row(report, backward, "log-softmax chunk temporaries") == 3 * 1024 * 152064 * 4
    assert _row(report, backward, "activations kept") == 24000 * 28 * 3584 * 2
    assert _row(report, "generation", "vLLM share") == int(0.6 * device)
    assert _row(report, "weight sync", "vLLM weights (awake)") == p * 2 // 2  # bf16 / TP 2
    shape = memory.ModelShape.read(LARGE_JSON)
    assert shape.kv_cache_bytes_per_token(2, 2) == 2 * 28 * 2 * 128 * 2  # K+V, 2 heads/rank


def test_7b_recipe_fits_an_80_gib_gpu_with_room_to_spare(memory):
    report = _report(memory, LARGE, LARGE_JSON)
    # Room left for what the calculator does not count (CUDA context, NCCL, fragmentation).
    assert report.peak.total <= report.device_bytes - 8 * GIB
    assert report.peak.name == "generation"


def test_05b_recipe_fits_40_gib_and_needs_checkpointing_on_24(memory):
    assert _report(memory, SMALL, SMALL_JSON, device_gib=40).peak.total <= 36 * GIB
    small = _report(memory, SMALL, SMALL_JSON, device_gib=24)
    assert small.peak.total > 24 * GIB  # the README says so: 8k-token micro-batches
    fixed = _report(memory, SMALL, SMALL_JSON, "actor.gradient_checkpointing=true", device_gib=24)
    assert fixed.peak.total <= 20 * GIB


# --- the command line and the README --------------------------------------------------------


def test_memory_reads_config_json_under_model_path(memory, tmp_path, capsys):
    shutil.copy(SMALL_JSON, tmp_path / "config.json")
    assert memory.main([str(SMALL), f"model.path={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "494,032,768 parameters" in out
    assert re.search(r"^Peak: generation, [\d.]+ of 79\.2 GiB", out, re.MULTILINE)


def test_memory_errors_are_one_line(memory, tmp_path, capsys):
    # ppo.toml keeps the HF rollout by default: not what memory.py models.
    assert memory.main([str(EXAMPLE / "ppo.toml"), "--model-config", str(SMALL_JSON)]) == 2
    assert capsys.readouterr().err == (
        "error: memory.py models the 'vllm' [rollout]; this recipe sets 'hf'\n"
    )
    assert memory.main([str(SMALL), f"model.path={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot read the model config {tmp_path / 'config.json'}")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("recipe", "model_json"), [(SMALL, SMALL_JSON), (LARGE, LARGE_JSON)], ids=["0.5b", "7b"]
)
def test_the_readme_tables_are_memory_py_output(memory, recipe, model_json):
    # The README's tables are regenerated, not edited: they must equal today's output.
    config, shape = memory.load(str(recipe), str(model_json))
    table = memory.render(memory.estimate(config, shape, int(memory.DEFAULT_DEVICE_GIB * GIB)))
    assert table in (EXAMPLE / "README.md").read_text()
