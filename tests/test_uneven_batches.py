"""Batch sizes that do not divide evenly train (``n`` is read once, on the driver).

The issue's case: ``train_batch_size = 5``, ``rollout.n = 8``, 2 processes, micro-batches of
4 once failed at step 1 with "union of DataProtos with 40 and 47 rows" (the dispatch padded
prompts and the rollout multiplied the padding by n). With rows expanded on the driver and the
update rows padded to whole rows per rank (zero-weight), it trains; so do 7 prompts × n = 3 on
2 and on 3 processes (21 rows: one padding row on 2 ranks, none on 3).
"""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("uneven")
    model = tiny_run_model(root / "model")
    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(14)]), root / "train.jsonl")
    return model, train


@pytest.mark.parametrize(
    ("prompts", "n", "processes", "micro"),
    [(5, 8, 2, 4), (7, 3, 2, 8), (7, 3, 3, 8)],
    ids=["5x8-on-2-micro4", "7x3-on-2", "7x3-on-3"],
)
def test_uneven_batch_trains(ray_session, assets, tmp_path, prompts, n, processes, micro):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import tiny_run_toml
    from rlcore.trainer import run_training

    model, train = assets
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        total_steps=1,
        train_batch_size=prompts,
        n=n,
        micro_batch_size=micro,
        processes_per_node=processes,
        cpus_per_process=0.5,
        experiment_name=f"uneven-{prompts}x{n}-{processes}",
    )
    config = load_config_text(text, source="uneven.toml", overrides=["trainer.export_final=false"])
    assert run_training(config) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    (step,) = [r for r in map(json.loads, lines) if r["step"] == 1]
    assert math.isfinite(step["actor/pg_loss"])
    assert math.isfinite(step["actor/grad_norm"])  # 0 when every reward ties (GRPO)
    assert step["actor/nonfinite"] == 0.0
    assert step["response_length/mean"] > 0
