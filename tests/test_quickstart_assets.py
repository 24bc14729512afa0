"""Quickstart assets: model shape, data format, held-out split, configs, a short warm start."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from rlcore.cli import main as rlcore_main
from rlcore.data import PromptDataLoader, PromptDataset, load_tokenizer

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart"
GSM8K_EXAMPLE = REPO / "examples" / "gsm8k"


def load_module(path: Path, name: str):
    sys.path.insert(0, str(path.parent))  # prepare.py imports its sibling make_model.py
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.fixture(scope="module")
def prepare():
    return load_module(QUICKSTART / "prepare.py", "quickstart_prepare")


@pytest.fixture(scope="module")
def model_dir(prepare, tmp_path_factory):
    return prepare.make_model(tmp_path_factory.mktemp("qs") / "model_init")


def test_model_follows_the_recipe_and_vllm_head_size(model_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "qwen2"
    assert cfg.hidden_size // cfg.num_attention_heads >= 32
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (128, 4, 2)
    assert cfg.tie_word_embeddings
    size = (model_dir / "model.safetensors").stat().st_size
    assert 3.5e6 < size < 4.5e6  # ~1.0M float32 parameters


def test_tokenizer_is_byte_level_with_a_chatml_template(model_dir):
    tok = load_tokenizer(model_dir)
    text = "What is 7 + 85?"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per ASCII character
    assert tok.decode(ids) == text
    assert tok.decode(tok("naïve ✓\n")["input_ids"]) == "naïve ✓\n"  # any text round-trips
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def test_pairs_split_into_disjoint_train_and_200_held_out(prepare):
    train, test = prepare.split_pairs(seed=0)
    assert len(test) == 200
    assert len(train) == 100 * 100 - 200
    assert not set(train) & set(test)
    assert all(0 <= a <= 99 and 0 <= b <= 99 for a, b in train + test)
    assert prepare.split_pairs(seed=0) == (train, test)  # deterministic


def test_rows_are_gsm8k_format_and_the_strict_rule_scores_them(prepare):
    (row,) = prepare.make_rows([(12, 34)], "test")
    assert row["data_source"] == "arithmetic"
    assert row["prompt"] == [{"role": "user", "content": "What is 12 + 34?"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "46"}
    answer = row["extra_info"]["answer"]
    assert answer == "12 + 34 = 46\n#### 46"
    assert re.fullmatch(r"\d+ \+ \d+ = \d+\n#### \d+", answer)
    assert prepare.strict_score(answer, "46") == 1.0
    assert prepare.strict_score("12 + 34 = 47\n#### 47", "46") == 0.0
    assert prepare.strict_score("46", "46") == 0.0  # no "####": strict gives nothing


def test_written_parquet_loads_unfiltered_within_the_config_limits(prepare, model_dir, tmp_path):
    train, test = prepare.write_data(tmp_path / "data")
    tok = load_tokenizer(model_dir)
    # max_prompt_length from grpo.toml; nothing may be filtered
    ds = PromptDataset(test, tok, max_prompt_length=64, name="val")
    assert len(ds) == 200
    import pyarrow.parquet as pq

    assert pq.read_metadata(train).num_rows == 9800
    answer_tokens = max(len(tok(prepare.answer(a, b))["input_ids"]) + 1 for a, b in [(99, 99)])
    assert answer_tokens <= 24  # max_response_length in grpo.toml, eos included
    batch = next(iter(PromptDataLoader(ds, 32, shuffle=True, seed=0)))
    assert batch.batch["input_ids"].shape[0] == 32


@pytest.mark.parametrize(
    "config",
    [
        QUICKSTART / "grpo.toml",
        QUICKSTART / "ppo.toml",
        QUICKSTART / "rloo.toml",
        GSM8K_EXAMPLE / "grpo.toml",
        GSM8K_EXAMPLE / "ppo.toml",
        GSM8K_EXAMPLE / "rloo.toml",
    ],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_example_configs_validate(config, capsys):
    assert rlcore_main(["config", "validate", str(config)]) == 0, capsys.readouterr().err
    assert "is valid" in capsys.readouterr().out


def test_run_sh_prepares_then_trains_grpo():
    text = (QUICKSTART / "run.sh").read_text()
    assert "examples/quickstart/prepare.py" in text
    assert "rlcore train examples/quickstart/grpo.toml" in text


def test_warm_start_runs_a_few_steps_and_saves(prepare, model_dir, tmp_path):
    summary = prepare.warm_start(
        model_dir,
        tmp_path / "sft",
        max_steps=3,
        batch_size=8,
        eval_every=3,
        eval_from=3,
        target_acc=2.0,  # unreachable: the loop runs to max_steps
        eval_limit=16,
    )
    assert summary["steps"] == 3
    assert len(summary["history"]) == 1
    assert 0.0 <= summary["held_out_acc"] <= 1.0
    assert (tmp_path / "sft" / "warm_start.json").is_file()
    assert load_tokenizer(tmp_path / "sft").eos_token == "<|im_end|>"
