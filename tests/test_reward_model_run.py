"""The reward-model role end to end (real Ray workers, FSDP2, HF rollout): a tiny
sequence-classification model is the run's only reward, its scores reach the advantages, and
its role is checkpointed as the name of its model. The pieces without Ray are in
``test_reward_model.py``; the bad inputs in ``test_bad_inputs_reward_model.py``."""

from __future__ import annotations

import json
import math

import pytest


@pytest.mark.slow
def test_a_reward_model_is_the_only_reward_and_reaches_the_advantages(ray_session, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.testing.tiny_model import build_tiny_reward_model
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    rm = build_tiny_reward_model(tmp_path / "rm", from_model=model, seed=3)
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        total_steps=2,
        save_freq=2,
        rewards=(),
        experiment_name="reward-model",
        # weight 2: what the algorithm trains on is twice the model's own score; "always":
        # the rows go through the decode / encode path of a reward model with its own tokenizer.
        extra=(
            f'[reward_model]\nenable = true\nmodel = {{ path = "{rm}" }}\nweight = 2.0\n'
            'retokenize = "always"\nmicro_batch_size = 3\n'
        ),
    )
    config = load_config_text(text, source="rm.toml")
    assert config.reward.selected() == ()
    assert config.reward_model.engine.name == "fsdp2"

    assert run_training(config) == 0

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "reward/scorer/rm/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        rm_mean = r["reward/scorer/rm/mean"]
        assert math.isfinite(rm_mean)
        assert rm_mean != 0.0
        # The only reward: the trained-on score is the weighted model score, per row.
        assert r["critic/score/mean"] == pytest.approx(2.0 * rm_mean, abs=1e-4)
        # A real-valued score differs within each group: the advantages are not all zero.
        assert r["critic/advantages/max"] > 0.0 > r["critic/advantages/min"]
        assert "timing_s/rm" in r
        assert "timing_s/worker/rm_forward" in r
        assert math.isfinite(r["actor/grad_norm"])
        assert "reward/rm/disagree_rule" not in r  # no rule reward to compare with
    # Frozen: the checkpoint holds which model it was, nothing else.
    step = tmp_path / "run" / "checkpoints" / "global_step_2"
    assert sorted(p.name for p in (step / "rm").iterdir()) == ["worker_state_rank0.pt"]
