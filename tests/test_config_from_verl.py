"""``rlcore config from-verl``: verl's own GSM8K GRPO example (its flattened ppo_trainer.yaml
plus the overrides of examples/grpo_trainer/run_qwen2-7b.sh, both verl v0.7.0, under
tests/data/verl/) becomes a TOML that rlcore's loader accepts, with the verl keys it does not
map listed one per line."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.config import load_config

VERL = Path(__file__).resolve().parent / "data" / "verl"
YAML = VERL / "ppo_trainer.yaml"


def _script_overrides(home: Path) -> list[str]:
    """The KEY=VALUE arguments of verl's run_qwen2-7b.sh, as its shell would pass them."""
    text = (VERL / "run_qwen2-7b.sh").read_text().replace("\\\n", " ")
    words = shlex.split(text.replace("$HOME", str(home)).replace("$@", ""))
    return words[words.index("verl.trainer.main_ppo") + 1 :]


@pytest.fixture
def gsm8k_overrides(tmp_path):
    """The example's overrides, its data and model pointed at small local files."""
    home = tmp_path / "home"
    (home / "data" / "gsm8k").mkdir(parents=True)
    for split in ("train", "test"):
        (home / "data" / "gsm8k" / f"{split}.parquet").write_bytes(b"PAR1")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    overrides = [
        f"actor_rollout_ref.model.path={model}"
        if o.startswith("actor_rollout_ref.model.path=")
        else o
        for o in _script_overrides(home)
    ]
    return overrides, home, model


def test_the_example_script_passes_the_overrides_expected(tmp_path):
    overrides = _script_overrides(tmp_path)
    assert "algorithm.adv_estimator=grpo" in overrides
    assert "actor_rollout_ref.rollout.n=5" in overrides
    assert 'trainer.logger=["console","wandb"]' in overrides
    assert len(overrides) == 37


def test_verl_gsm8k_grpo_converts_to_a_config_rlcore_loads(gsm8k_overrides, tmp_path, capsys):
    overrides, home, model = gsm8k_overrides
    out = tmp_path / "run.toml"
    assert main(["config", "from-verl", str(YAML), *overrides, "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()

    cfg = load_config(out)  # rlcore's own loader validates every section and plugin key
    assert cfg.data.train_files == (str(home / "data/gsm8k/train.parquet"),)
    assert cfg.data.val_files == (str(home / "data/gsm8k/test.parquet"),)
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (1024, 512)
    assert cfg.data.max_response_length == 1024
    assert (cfg.data.filter_overlong_prompts, cfg.data.truncation) == (True, "error")
    assert cfg.model.path == str(model)
    assert cfg.actor.optim.lr == 1e-6
    assert (cfg.actor.ppo_mini_batch_size, cfg.actor.micro_batch_size) == (256, 40)
    assert cfg.actor.gradient_checkpointing is True
    assert cfg.actor.engine.name == "fsdp2"
    assert cfg.actor.engine.options.use_remove_padding is True
    assert cfg.actor.engine.options.offload_params is False
    assert cfg.ref.micro_batch_size == 40
    assert cfg.ref.engine.options.offload_params is True  # the example offloads the reference
    assert cfg.ref.engine.options.use_remove_padding is True  # and keeps the actor's options
    assert (cfg.rollout.name, cfg.rollout.n) == ("vllm", 5)
    assert cfg.rollout.options.gpu_memory_utilization == 0.6
    assert cfg.rollout.options.tensor_parallel_size == 2
    algo = cfg.algorithm.options
    assert cfg.algorithm.name == "grpo"
    assert algo.adv_estimator == "grpo"
    assert (algo.use_kl_loss, algo.kl_loss_coef, algo.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert (algo.entropy_coeff, algo.use_kl_in_reward) == (0.0, False)
    assert cfg.trainer.total_epochs == 15
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == (20, 5)
    assert cfg.trainer.experiment_name == "qwen2_7b_function_rm"
    assert cfg.trainer.loggers == ("console", "wandb")
    assert cfg.trainer.logger_options["wandb"].project == "verl_grpo_example_gsm8k"
    assert (cfg.resources.nnodes, cfg.resources.processes_per_node) == (1, 8)
    assert cfg.resources.device == "cuda"
    assert cfg.reward.sources["openai/gsm8k"] == ("gsm8k",)

    # The verl keys without an rlcore counterpart: one line each, then the count.
    unmapped = [line for line in err if line.startswith("not mapped: ")]
    assert f"wrote {out}" in err
    assert err[-1] == f"{len(unmapped)} verl keys not mapped"
    assert "not mapped: trainer.critic_warmup = 0 (no rlcore key)" in unmapped
    assert (
        "not mapped: actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = 40 "
        "(no rlcore key)" in unmapped
    )
    # PPO-only options, not options of the GRPO algorithm: named with where they would go.
    assert (
        "not mapped: algorithm.gamma = 1.0 (-> algorithm.gamma, which the selected plugin lacks)"
        in unmapped
    )
    assert not any("_target_" in line for line in unmapped)
    assert len(unmapped) == len(set(unmapped))


def test_gae_selects_ppo_with_its_options(gsm8k_overrides, tmp_path, capsys):
    overrides, _, _ = gsm8k_overrides
    overrides = [o for o in overrides if not o.startswith("algorithm.adv_estimator=")]
    out = tmp_path / "ppo.toml"
    args = [*overrides, "algorithm.adv_estimator=gae", "critic.cliprange_value=0.3"]
    assert main(["config", "from-verl", str(YAML), *args, "-o", str(out)]) == 0
    cfg = load_config(out)
    assert (cfg.algorithm.name, cfg.algorithm.options.adv_estimator) == ("ppo", "gae")
    assert (cfg.algorithm.options.gamma, cfg.algorithm.options.lam) == (1.0, 1.0)
    assert cfg.algorithm.options.cliprange_value == 0.3
    assert cfg.critic.model_path == cfg.model.path
    assert "algorithm.gamma" not in capsys.readouterr().err


def test_a_hydra_composed_yaml_is_one_line(tmp_path, capsys):
    composed = tmp_path / "ppo_trainer.yaml"
    composed.write_text("defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n")
    assert main(["config", "from-verl", str(composed)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: verl config '{composed}' composes other files")
    assert "_generated_ppo_trainer.yaml" in err


def test_a_missing_yaml_is_one_line(tmp_path, capsys):
    assert main(["config", "from-verl", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err == f"error: verl config '{tmp_path / 'nope.yaml'}' not found\n"


def test_rollout_correction_icepop_and_rejection_masks(gsm8k_overrides, tmp_path):
    # verl's "lower_upper" rollout_is_threshold is IcePop's band; rollout_rs keeps its names.
    overrides, _, _ = gsm8k_overrides
    out = tmp_path / "rc.toml"
    args = [
        *overrides,
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold='0.5_2.0'",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.01",
    ]
    assert main(["config", "from-verl", str(YAML), *args, "-o", str(out)]) == 0
    options = load_config(out).algorithm.options
    assert (options.rollout_is, options.rollout_is_threshold_lower) == ("token", 0.5)
    assert options.rollout_is_cap == 2.0
    assert (options.rollout_rs, options.rollout_rs_threshold) == ("seq_mean_k3", "0.01")
