"""The judge end to end: real Ray workers (FSDP2 actor, HF rollout for the policy and, in a
role of its own beside it, for the judge) through ``run_training``, combined with the GSM8K
rule reward by weight.

The judge is the tiny run's random model: it writes garbage, so nearly every judgement is
unparseable; the run must complete and log how many were, every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/scorer/judge/unparseable" in r]


@pytest.mark.slow
def test_a_tiny_judge_run_completes_and_counts_unparseable_judgements(ray_session, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(arithmetic_rows([(1, 2), (3, 4), (5, 6), (7, 8)]), tmp_path / "t.jsonl")
    judge = f"""
[reward.weights]
gsm8k = 1.0
judge = 0.5

[reward.options.judge]
model_path = {json.dumps(str(model))}
template = "Q: {{prompt}}\\nA: {{response}}\\nTruth: {{ground_truth}}\\nRate 0-10 as [[n]]."
max_prompt_length = 48
max_new_tokens = 6
batch_size = 3
unparseable_score = 0.25
timeout_s = 120
"""
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        rewards=("gsm8k", "judge"),
        total_steps=2,
        extra=judge,
    )
    config = load_config_text(text, source="judge.toml")
    assert run_training(config) == 0

    steps = _steps(tmp_path / "run")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        unparseable = r["reward/scorer/judge/unparseable"]
        frac = r["reward/scorer/judge/unparseable_frac"]
        # 4 prompts x 2 samples; a row with an empty response is not judged (no token)
        judged = 8 - r["reward/empty_responses"]
        assert 0 <= unparseable <= judged
        assert frac == pytest.approx(unparseable / max(judged, 1))
        assert r["reward/scorer/judge/calls"] == -(-judged // 3)  # batch_size 3 per call
        # the judge's prompt (template + prompt + response) is longer than 48 tokens
        assert r["reward/scorer/judge/truncated_prompts"] == judged
        assert r["reward/scorer/judge/generate_s"] > 0
        assert 0 <= r["reward/scorer/judge/mean"] <= 1
        if unparseable == judged:  # garbage throughout: every row the configured default
            assert r["reward/scorer/judge/mean"] == pytest.approx(0.25)
        if judged == 8:  # every row scored by both: the combined score is the weighted sum
            expected = r["reward/scorer/gsm8k/mean"] + 0.5 * r["reward/scorer/judge/mean"]
            assert r["critic/score/mean"] == pytest.approx(expected, abs=1e-6)
        assert "timing_s/reward" in r
    # a random judge does not write "[[n]]": most judgements are unparseable
    total = sum(r["reward/scorer/judge/unparseable"] for r in steps)
    assert total >= 0.5 * sum(8 - r["reward/empty_responses"] for r in steps)
