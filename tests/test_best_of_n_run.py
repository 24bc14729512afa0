"""Best-of-n fine-tuning trains in a real run on the kept rows only (issue 49, item 3).

One step of the tiny run: 4 prompts x 4 samples, each prompt's best response kept (the
tiny model is never right, so ``min_score = 0`` keeps the first of each group): the actor's
update holds those 4 rows and no zero-weight padding row (``actor/padding_rows_frac`` is
what the worker counted in the rows it was handed).
"""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.slow


def test_best_of_n_update_gets_the_kept_rows_and_no_padding(ray_session, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        algorithm="best_of_n",
        algorithm_options="min_score = 0.0\nkeep_per_prompt = 1",
        total_steps=1,
        train_batch_size=4,
        n=4,
        experiment_name="best-of-n",
    )
    config = load_config_text(text, source="bon.toml", overrides=["trainer.export_final=false"])
    assert run_training(config) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    (step,) = [r for r in map(json.loads, lines) if r["step"] == 1]
    assert step["best_of_n/kept_rows"] == 4.0  # one of each prompt's 4 samples
    assert step["actor/padding_rows_frac"] == 0.0  # no zero-weight row reached the update
    assert math.isfinite(step["actor/pg_loss"])
    assert step["actor/pg_loss"] > 0
    assert step["actor/nonfinite"] == 0.0
