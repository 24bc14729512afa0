"""The wandb logger for real, offline: the run file holds exactly what metrics.jsonl holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlcore.config import load_config_text
from rlcore.testing.conformance import check_plugin_module
from rlcore.tracking import Tracker
from rlcore_wandb import records
from rlcore_wandb.logger import RUN_ID_FILE, WandbLogger

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

STEPS = [
    {"critic/score/mean": 0.25, "actor/pg_loss": -0.125, "timing_s/step": 1.5},
    {"critic/score/mean": 0.5, "actor/pg_loss": float("nan"), "val/acc": 0.75},
    {"critic/score/mean": 0.625, "actor/pg_loss": 0.0625, "response_length/mean": 12},
]


def offline_options():
    return {"wandb": WandbLogger.Config(project="rlcore-test", mode="offline")}


def run_file(run_dir: Path, run_id: str) -> Path:
    """The run's file, once wandb's writer (a separate process) has closed it: ``finish()``
    can return before the last records reach the disk."""
    (found,) = records.run_files(run_dir, run_id)
    return records.wait_closed(found)


def jsonl_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def logged_values(row: dict) -> dict:
    """What a tracker can hold of a metrics.jsonl row: the numbers (None: not finite)."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, int | float)}


def test_offline_run_holds_the_jsonl_metrics_and_the_config(tmp_path):
    run_dir = tmp_path / "run"
    config = {"actor": {"optim": {"lr": 1e-6}}, "trainer": {"seed": 3}}
    with Tracker(
        run_dir,
        ["jsonl", "wandb"],
        total_steps=3,
        experiment_name="exp",
        config=config,
        logger_options=offline_options(),
    ) as tracker:
        for step, metrics in enumerate(STEPS, start=1):
            tracker.log(metrics, step)
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    history = records.history(run_file(run_dir, run_id))
    expected = [logged_values(row) for row in jsonl_rows(run_dir)]
    got = [{k: v for k, v in row.items() if not k.startswith("_")} for row in history]
    assert got == expected
    assert [row["_step"] for row in history] == [1, 2, 3]
    assert not any(isinstance(v, float) and math.isnan(v) for row in got for v in row.values())
    assert records.config(run_file(run_dir, run_id))["actor"] == {"optim": {"lr": 1e-6}}


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    with Tracker(run_dir, ["wandb"], logger_options=offline_options()) as tracker:
        tracker.log(STEPS[0], 1)
    first = (run_dir / RUN_ID_FILE).read_text().strip()
    with Tracker(run_dir, ["wandb"], start_step=1, logger_options=offline_options()) as tracker:
        tracker.log(STEPS[1], 2)
    assert (run_dir / RUN_ID_FILE).read_text().strip() == first
    files = [records.wait_closed(f) for f in records.run_files(run_dir, first)]
    assert len(files) == 2
    steps = sorted(row["_step"] for f in files for row in records.history(f))
    assert steps == [1, 2]


def test_plots_are_logged_as_images(tmp_path):
    pytest.importorskip("matplotlib")
    from rlcore.tracking.plotting import plot_run

    run_dir = tmp_path / "run"
    with Tracker(run_dir, ["jsonl", "wandb"], logger_options=offline_options()) as tracker:
        for step, metrics in enumerate(STEPS, start=1):
            tracker.log(metrics, step)
        tracker.log_files(plot_run(run_dir))
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    rows = records.history(run_file(run_dir, run_id))
    assert any(row.get("plots/summary/_type") == "image-file" for row in rows)


def test_options_come_from_the_toml(tmp_path):
    text = """
[data]
train_files = ["t.jsonl"]
[model]
path = "m"
[reward]
default = "gsm8k"
[trainer]
loggers = ["console", "wandb"]
[trainer.logger_options.wandb]
project = "p1"
mode = "offline"
"""
    config = load_config_text(text, source="c.toml")
    options = config.trainer.logger_options["wandb"]
    assert (options.project, options.mode) == ("p1", "offline")
    bad = text.replace('mode = "offline"', 'mode = "sometimes"')
    with pytest.raises(Exception, match=r"trainer\.logger_options\.wandb\.mode: must be one of"):
        load_config_text(bad, source="c.toml")


def test_plugin_module_is_light():
    assert check_plugin_module("rlcore_wandb.plugin") == {
        "logger/wandb": "rlcore_wandb.logger:WandbLogger"
    }
