"""End-to-end runs of the trainer: real Ray workers, FSDP2 engine, HF rollout, GSM8K reward.

A tiny random model and a few synthetic "What is a + b?" prompts in verl's schema; two
training steps each. What is checked: finite metrics with the documented names, the JSONL
file, the config and the plots in the run directory, and that the algorithm decides the roles
(GRPO: policy only; PPO: critic values and losses; KL: reference log-probs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("trainer_e2e")
    model = tiny_run_model(root / "model")
    data = root / "data"
    data.mkdir()
    write_jsonl(arithmetic_rows([(a, b) for a in range(4) for b in range(4)]), data / "train.jsonl")
    write_jsonl(arithmetic_rows([(10, 20), (30, 40), (5, 6)], "test"), data / "test.jsonl")
    return root, model, data


def _config(assets, tmp_path: Path, algorithm: str, **options):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml

    _, model, data = assets
    text = tiny_run_toml(
        model=model,
        train_files=[data / "train.jsonl"],
        val_files=[data / "test.jsonl"],
        run_dir=tmp_path / "run",
        algorithm=algorithm,
        test_freq=2,
        experiment_name=f"e2e-{algorithm}",
        **options,
    )
    return load_config_text(text, source=f"e2e-{algorithm}.toml")


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _check_finite(rows: list[dict]) -> None:
    for row in rows:
        for key, value in row.items():
            assert value is not None, f"step {row['step']}: {key} is not finite"
            if isinstance(value, float):
                assert math.isfinite(value), f"step {row['step']}: {key} = {value}"


def test_grpo_two_steps_writes_metrics_config_and_plots(ray_session, assets, tmp_path):
    from rlcore.trainer import run_training

    config = _config(assets, tmp_path, "grpo")
    assert run_training(config) == 0

    run = tmp_path / "run"
    rows = _lines(run)
    _check_finite(rows)
    assert [r["step"] for r in rows] == [0, 1, 2]  # validation before training, 2 steps
    before, _, last = rows
    assert set(before) >= {"val/arithmetic/acc", "val/arithmetic/score"}
    for key in (
        "timing_s/gen",
        "timing_s/reward",
        "timing_s/adv",
        "timing_s/update_actor",
        "timing_s/step",
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
        "critic/score/mean",
        "critic/rewards/mean",
        "critic/advantages/mean",
        "response_length/mean",
        "response_length/clip_ratio",
        "perf/tokens_per_s",
        "val/arithmetic/acc",  # test_freq = 2: validated at step 2
    ):
        assert key in last, key
    # GRPO: no critic, no reference (no KL configured).
    assert "timing_s/values" not in last
    assert "timing_s/ref" not in last
    # On-policy (1 epoch, 1 mini-batch): old log-probs come from the training forward.
    assert "timing_s/old_log_prob" not in last
    # A random model earns no reward: zero GRPO advantages, a zero (but finite) gradient.
    assert last["actor/grad_norm"] >= 0
    # The step time covers its phases.
    phases = sum(last[f"timing_s/{p}"] for p in ("gen", "update_actor"))
    assert phases <= last["timing_s/step"]
    assert (run / "config.toml").is_file()
    assert "grpo" in (run / "config.toml").read_text()
    pytest.importorskip("matplotlib")
    assert (run / "plots" / "reward.png").is_file()
    assert (run / "plots" / "val_accuracy.png").is_file()


def test_ppo_trains_a_critic_and_kl_adds_the_reference(ray_session, assets, tmp_path):
    from rlcore.trainer import run_training

    # KL in the reward needs the reference policy: the algorithm decides, the trainer follows.
    config = _config(
        assets,
        tmp_path,
        "ppo",
        algorithm_options="use_kl_in_reward = true",
        critic_lr=1e-3,
    )
    config = attrs.evolve(
        config, trainer=attrs.evolve(config.trainer, val_before_train=False, test_freq=0)
    )
    assert run_training(config) == 0
    rows = _lines(tmp_path / "run")
    _check_finite(rows)
    assert [r["step"] for r in rows] == [1, 2]
    last = rows[-1]
    for key in (
        "timing_s/values",
        "timing_s/update_critic",
        "timing_s/ref",
        "critic/vf_loss",
        "critic/grad_norm",
        "critic/values/mean",
        "critic/returns/mean",
        "actor/reward_kl_penalty",
    ):
        assert key in last, key
    # GAE advantages against an untrained critic are not zero: both models get gradients.
    assert last["actor/grad_norm"] > 0
    assert last["critic/grad_norm"] > 0
    assert not any(k.startswith("val/") for r in rows for k in r)


def test_a_worker_failure_is_one_error_naming_the_role_and_frees_the_workers(
    ray_session, assets, tmp_path
):
    """A model folder with a tokenizer but no weights: the driver loads the tokenizer, the
    worker fails to build its engine; the error names role, rank and method."""
    import shutil
    import time

    import ray

    from rlcore.errors import WorkerError
    from rlcore.trainer import run_training

    root, model, data = assets
    broken = tmp_path / "no_weights"
    shutil.copytree(model, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    config = _config((root, broken, data), tmp_path, "grpo")
    with pytest.raises(WorkerError, match=r"actor_rollout_ref rank 0 failed in init_model"):
        run_training(config)
    # The group's process and placement group are released for the next run.
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)
