"""A batched reward scorer written here and the GSM8K rule reward, combined by weight in one
real run (``run_training``: Ray workers, FSDP2, HF rollout): both scorers' own metrics reach
``metrics.jsonl`` and the trained-on score is their weighted sum. The manager's unit tests
are ``test_reward_batched.py``.

The scorer runs in the driver, so a class registered in-process is enough: the workers never
unpickle it."""

from __future__ import annotations

import json
import math

import attrs
import pytest
import torch

from rlcore.hookspecs import hookimpl
from rlcore.interfaces import CONTRACT_VERSION, BaseBatchReward, BatchScores
from rlcore.plugins import PluginRegistry


class LengthScorer(BaseBatchReward):
    """The fraction of the response budget a row used, as one sequence-level score per row."""

    @attrs.frozen(kw_only=True)
    class Config(BaseBatchReward.Config):
        scale: float = 1.0

    def score_batch(self, batch):
        used = batch.response_mask.sum(-1) / batch.response_mask.shape[1]
        return BatchScores(
            scores=self.config.scale * used.to(torch.float32),
            metrics={"rows": float(len(batch))},
        )


class LengthPlugin:
    contract_version = CONTRACT_VERSION

    @staticmethod
    @hookimpl
    def register_rewards():
        return {"my_batched": LengthScorer}


@pytest.fixture(scope="module")
def registry():
    reg = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    reg.register(LengthPlugin(), name="batched-reward-test")
    return reg


REWARD = """[reward]
default = ["gsm8k", "my_batched"]
weights = { gsm8k = 1.0, my_batched = 0.5 }
batch_timeout_s = 120

[reward.options.my_batched]
scale = 2.0
"""


@pytest.mark.slow
def test_a_batched_scorer_and_a_rule_reward_train_together(ray_session, tmp_path, registry):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        total_steps=2,
        experiment_name="batched-reward",
    )
    assert '[reward]\ndefault = ["gsm8k"]\n' in text
    text = text.replace('[reward]\ndefault = ["gsm8k"]\n', REWARD)
    config = load_config_text(text, source="batched.toml", registry=registry)
    assert config.reward.weights == {"gsm8k": 1.0, "my_batched": 0.5}
    assert config.reward.options["my_batched"] == LengthScorer.Config(scale=2.0)

    assert run_training(config, registry=registry) == 0

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "reward/scorer/my_batched/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        gsm8k, batched = r["reward/scorer/gsm8k/mean"], r["reward/scorer/my_batched/mean"]
        assert 0.0 <= gsm8k <= 1.0
        # scale 2 x the used fraction of 8 tokens: a positive multiple of 2/8.
        assert 0.0 < batched <= 2.0
        assert (batched * 4) == pytest.approx(round(batched * 4))
        # 4 prompts x n=2 rows, none empty (every response has at least its first token).
        assert r["reward/scorer/my_batched/rows"] == 8.0
        # What the algorithm trained on is the weighted sum of the two, per row, averaged.
        assert r["critic/score/mean"] == pytest.approx(gsm8k + 0.5 * batched, abs=1e-5)
        assert "timing_s/reward" in r
        assert math.isfinite(r["actor/grad_norm"])
