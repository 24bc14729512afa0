"""Quickstart assets: model shape, data format, held-out split, configs, a short warm start."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
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


def test_pairs_split_into_disjoint_train_dev_and_200_held_out(prepare):
    train, dev, test = prepare.split_pairs()
    assert len(test) == len(dev) == 200
    assert len(train) == 100 * 100 - 400
    assert not set(train) & set(test)
    assert not set(train) & set(dev)
    assert not set(dev) & set(test)
    assert all(0 <= a <= 99 and 0 <= b <= 99 for a, b in train + dev + test)
    assert prepare.split_pairs() == (train, dev, test)  # deterministic
    # The held-out test pairs are those of the earlier two-way split (seed 0's first 200),
    # and no --seed changes them: every seed is measured on the same prompts.
    pairs = [(a, b) for a in range(100) for b in range(100)]
    import random

    random.Random(prepare.DATA_SEED).shuffle(pairs)
    assert test == pairs[:200]


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
    paths = prepare.write_data(tmp_path / "data")
    train, test = paths["train"], paths["test"]
    tok = load_tokenizer(model_dir)
    # max_prompt_length from grpo.toml; nothing may be filtered
    ds = PromptDataset(test, tok, max_prompt_length=64, name="val")
    assert len(ds) == 200
    import pyarrow.parquet as pq

    assert pq.read_metadata(train).num_rows == 9600
    assert pq.read_metadata(paths["dev"]).num_rows == 200
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
        QUICKSTART / "dapo.toml",
        QUICKSTART / "remax.toml",
        QUICKSTART / "distill.toml",
        QUICKSTART / "judge.toml",
        GSM8K_EXAMPLE / "grpo.toml",
        GSM8K_EXAMPLE / "grpo_7b_8gpu.toml",
        GSM8K_EXAMPLE / "ppo.toml",
        GSM8K_EXAMPLE / "rloo.toml",
        GSM8K_EXAMPLE / "smoke.toml",
    ],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_example_configs_validate(config, capsys):
    overrides = []
    if 'name = "vllm"' in config.read_text() and importlib.util.find_spec("rlcore_vllm") is None:
        # The one-GPU GSM8K config uses vLLM; without the plugin, check everything else.
        overrides = ["rollout.name=hf"]
    code = rlcore_main(["config", "validate", str(config), *overrides])
    assert code == 0, capsys.readouterr().err
    assert "is valid" in capsys.readouterr().out


@pytest.mark.parametrize("config", sorted(REPO.glob("examples/*/*.toml")), ids=lambda p: p.name)
def test_no_example_logs_to_tensorboard_by_default(config):
    # tensorboard is not in the install (it pulls grpcio, protobuf and a web server): a
    # default logger that is not there would only print "pip install tensorboard".
    loggers = tomllib.loads(config.read_text())["trainer"]["loggers"]
    assert "tensorboard" not in loggers


def test_run_sh_threads_the_seed_through_every_stage():
    text = (QUICKSTART / "run.sh").read_text()
    assert 'python examples/quickstart/prepare.py --seed "$seed"' in text  # init + batches
    assert "config=examples/quickstart/grpo.toml" in text  # the default algorithm
    assert 'rlcore train "$config"' in text
    for override in (
        '"model.path=$work/seed$seed/model_sft"',  # the seed's own warm start
        '"data.seed=$seed"',  # prompt order
        '"trainer.seed=$seed"',  # sampling and everything else the trainer seeds
        'name="quickstart-$(basename "$config" .toml)"',  # quickstart-grpo by default
        'run_dir="${run_dir:-runs/$name-seed$seed}"',  # one run dir per seed and algorithm
    ):
        assert override in text, override
    # The seed's model path is the one prepare.py writes.
    assert text.count("seed$seed/model_sft") == 1


def test_the_quickstart_config_is_the_documented_recipe():
    cfg = tomllib.loads((QUICKSTART / "grpo.toml").read_text())
    assert (cfg["data"]["train_batch_size"], cfg["rollout"]["n"]) == (32, 8)
    assert cfg["rollout"]["temperature"] == 1.0
    assert cfg["data"]["max_response_length"] == 24
    assert cfg["actor"]["optim"]["lr"] == 1e-4
    assert cfg["actor"]["optim"]["schedule"] == "cosine"
    assert cfg["algorithm"]["clip_ratio_low"] == cfg["algorithm"]["clip_ratio_high"] == 0.2
    assert cfg["algorithm"]["loss_agg_mode"] == "token-mean"
    assert cfg["trainer"]["total_steps"] % cfg["trainer"]["test_freq"] == 0  # last step validated


def test_warm_start_runs_to_max_steps_and_evaluates_the_model_it_saves(
    prepare, model_dir, tmp_path
):
    summary = prepare.warm_start(
        model_dir,
        tmp_path / "sft",
        max_steps=3,
        batch_size=8,
        eval_every=10,
        eval_from=100,  # no scheduled evaluation before max_steps...
        target_acc=2.0,  # ... and an unreachable target: the loop runs to max_steps
        eval_limit=16,
    )
    assert summary["steps"] == 3
    # ... where the saved model is evaluated: every accuracy reported was measured.
    assert [step for step, _ in summary["history"]] == [3]
    assert summary["dev_acc"] == summary["history"][-1][1]
    assert 0.0 <= summary["test_acc"] <= 1.0
    assert summary["reached_target"] is False
    saved = json.loads((tmp_path / "sft" / "warm_start.json").read_text())
    assert saved["steps"] == 3
    assert load_tokenizer(tmp_path / "sft").eos_token == "<|im_end|>"


def test_warm_start_stops_at_the_first_evaluation_that_reaches_the_target(
    prepare, model_dir, tmp_path
):
    summary = prepare.warm_start(
        model_dir,
        tmp_path / "sft",
        max_steps=50,
        batch_size=4,
        eval_every=2,
        eval_from=2,
        target_acc=0.0,  # any accuracy reaches it: the first scheduled evaluation stops
        eval_limit=8,
    )
    assert summary["steps"] == 2
    assert summary["reached_target"] is True
    assert [step for step, _ in summary["history"]] == [2]


def test_prepare_cli_evaluates_on_the_given_schedule_and_seeds_its_own_folder(
    prepare, tmp_path, capsys
):
    args = ["--work-dir", str(tmp_path), "--seed", "3", "--max-steps", "4", "--batch-size", "4"]
    args += ["--eval-every", "2", "--eval-from", "2", "--eval-size", "8", "--target-acc", "1.5"]
    assert prepare.main(args) == 0
    out = capsys.readouterr().out
    evaluated = re.findall(r"warm start step +(\d+) .*dev acc", out)
    assert evaluated == ["2", "4"]  # --eval-every 2 from step 2, up to --max-steps 4
    assert "did not reach 150% dev accuracy within --max-steps 4" in out
    summary = json.loads((tmp_path / "seed3" / "model_sft" / "warm_start.json").read_text())
    assert summary["seed"] == 3
    assert [step for step, _ in summary["history"]] == [2, 4]
    # The model's init follows the seed; the data does not.
    from safetensors.torch import load_file

    other = prepare.make_model(tmp_path / "other_seed", seed=4)
    mine = load_file(tmp_path / "seed3" / "model_init" / "model.safetensors")
    theirs = load_file(other / "model.safetensors")
    assert any((mine[k] != theirs[k]).any() for k in mine)
    assert (tmp_path / "data" / "dev.parquet").is_file()
    # A second call skips what exists and prints the accuracy it has on file, not a new one.
    assert prepare.main(args) == 0
    again = capsys.readouterr().out
    assert "warm start exists" in again
    assert f"held-out test accuracy {summary['test_acc']:.1%}" in again
    assert "dev acc" not in again


@pytest.mark.parametrize("other", ["dapo.toml", "remax.toml", "distill.toml"])
def test_algorithm_variants_share_the_quickstart_recipe(other):
    # A variant's curve is comparable with GRPO's only when it trains the same warm start on
    # the same data with the same budget and optimiser: only [algorithm], [roles] and the
    # run's names may differ.
    base = tomllib.loads((QUICKSTART / "grpo.toml").read_text())
    cfg = tomllib.loads((QUICKSTART / other).read_text())
    for section in ("data", "model", "actor", "rollout", "reward", "resources"):
        assert cfg[section] == base[section], section
    names = ("experiment_name", "run_dir")
    assert {k: v for k, v in cfg["trainer"].items() if k not in names} == {
        k: v for k, v in base["trainer"].items() if k not in names
    }
