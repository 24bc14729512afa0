"""A real run logging to wandb (offline) and MLflow (a local SQLite store) beside metrics.jsonl.

The tiny end-to-end run (real Ray workers, FSDP2, HF rollout, GSM8K reward, validation) with
``trainer.loggers = ["console", "jsonl", "wandb", "mlflow"]``: both trackers must hold exactly
the numbers ``metrics.jsonl`` holds, step by step, plus the config and the run's plots.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

pytest.importorskip("rlcore_wandb")
pytest.importorskip("rlcore_mlflow")


def _jsonl(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _wandb_rows(run: Path) -> list[dict]:
    from rlcore_wandb import records

    run_id = (run / "wandb_run_id").read_text().strip()
    (path,) = records.run_files(run, run_id)
    return records.history(records.wait_closed(path))


def test_wandb_and_mlflow_hold_what_metrics_jsonl_holds(ray_session, tmp_path):
    from mlflow.tracking import MlflowClient

    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training
    from rlcore_mlflow.logger import metric_key

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(
        arithmetic_rows([(a, b) for a in range(3) for b in range(3)]), tmp_path / "t.jsonl"
    )
    val = write_jsonl(arithmetic_rows([(10, 20), (5, 6)], "test"), tmp_path / "v.jsonl")
    run = tmp_path / "run"
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        val_files=[val],
        run_dir=run,
        test_freq=2,
        experiment_name="loggers-e2e",
    )
    config = load_config_text(
        text,
        source="loggers.toml",
        overrides=[
            'trainer.loggers=["console", "jsonl", "wandb", "mlflow"]',
            'trainer.logger_options.wandb.mode="offline"',
            'trainer.logger_options.wandb.project="rlcore-e2e"',
        ],
    )
    assert run_training(config) == 0

    rows = _jsonl(run)
    assert [r["step"] for r in rows if "critic/score/mean" in r] == [1, 2]
    numbers = [
        {k: v for k, v in r.items() if k != "step" and isinstance(v, int | float)} for r in rows
    ]

    # wandb: one history row per logged step (rows of one step merge), same values.
    by_step: dict[int, dict] = {}
    for r, nums in zip(rows, numbers):
        by_step.setdefault(r["step"], {}).update(nums)
    history = _wandb_rows(run)
    got = {
        h["_step"]: {k: v for k, v in h.items() if not k.startswith(("_", "plots/"))}
        for h in history
    }
    got = {step: row for step, row in got.items() if row}
    assert got == by_step
    assert any(h.get("plots/summary/_type") == "image-file" for h in history)

    # MLflow: every key's (step, value) history equals metrics.jsonl's.
    expected: dict[str, list] = {}
    for r, nums in zip(rows, numbers):
        for k, v in nums.items():
            expected.setdefault(metric_key(k), []).append((r["step"], float(v)))
    client = MlflowClient(tracking_uri=f"sqlite:///{(run / 'mlflow.db').resolve()}")
    run_id = (run / "mlflow_run_id").read_text().strip()
    stored = client.get_run(run_id)
    assert {
        k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k))
        for k in stored.data.metrics
    } == {k: sorted(v) for k, v in expected.items()}
    assert stored.data.params["algorithm.name"] == "grpo"
    assert stored.data.params["trainer.loggers"] == "['console', 'jsonl', 'wandb', 'mlflow']"
    assert "plots/summary.png" in [a.path for a in client.list_artifacts(run_id, "plots")]
