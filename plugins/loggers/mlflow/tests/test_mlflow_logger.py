"""The MLflow logger for real, on a local SQLite store: metrics read back equal metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from rlcore.testing.conformance import check_plugin_module
from rlcore.tracking import Tracker
from rlcore_mlflow.logger import RUN_ID_FILE, MlflowLogger, flat_params, metric_key

STEPS = [
    {"critic/score/mean": 0.25, "actor/pg_loss": -0.125, "timing_s/step": 1.5},
    {"critic/score/mean": 0.5, "actor/pg_loss": float("nan"), "val/gsm8k@4/acc": 0.75},
    {"critic/score/mean": 0.625, "actor/pg_loss": 0.0625, "response_length/mean": 12},
]


def jsonl_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each numeric key of metrics.jsonl -> [(step, value)], as MLflow should hold them."""
    found: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float):
                found.setdefault(metric_key(key), []).append((row["step"], float(value)))
    return found


def mlflow_metrics(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    keys = client.get_run(run_id).data.metrics
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in keys
    }


def test_local_store_holds_the_jsonl_metrics_params_and_plots(tmp_path):
    run_dir = tmp_path / "run"
    config = {"actor": {"optim": {"lr": 1e-6}}, "trainer": {"seed": 3, "loggers": ["mlflow"]}}
    with Tracker(run_dir, ["jsonl", "mlflow"], experiment_name="exp", config=config) as tracker:
        for step, metrics in enumerate(STEPS, start=1):
            tracker.log(metrics, step)
        plot = run_dir / "plots" / "summary.png"
        plot.parent.mkdir()
        plot.write_bytes(b"\x89PNG not really")
        tracker.log_files([plot])
    # The tracker is closed: read the store back as a user would.
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    assert mlflow_metrics(client, run_id) == jsonl_metrics(run_dir)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["actor.optim.lr"] == "1e-06"
    assert run.data.params["trainer.loggers"] == "['mlflow']"
    assert [a.path for a in client.list_artifacts(run_id, "plots")] == ["plots/summary.png"]
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path):
    run_dir = tmp_path / "run"
    with Tracker(run_dir, ["jsonl", "mlflow"]) as tracker:
        tracker.log(STEPS[0], 1)
    first = (run_dir / RUN_ID_FILE).read_text().strip()
    with Tracker(run_dir, ["jsonl", "mlflow"], start_step=1) as tracker:
        tracker.log(STEPS[2], 2)
    assert (run_dir / RUN_ID_FILE).read_text().strip() == first
    client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")
    assert mlflow_metrics(client, first) == jsonl_metrics(run_dir)
    assert len(client.search_runs([client.get_run(first).info.experiment_id])) == 1


def test_a_store_that_fails_mid_run_is_skipped_not_fatal(tmp_path, caplog):
    run_dir = tmp_path / "run"
    with Tracker(run_dir, ["jsonl", "mlflow"]) as tracker:
        tracker.log(STEPS[0], 1)
        (mlflow,) = [lg for lg in tracker.loggers if isinstance(lg, MlflowLogger)]
        mlflow.run_id = "no-such-run"  # the store now refuses every write
        tracker.log(STEPS[1], 2)
        tracker.log(STEPS[2], 3)
    assert "logger 'mlflow' failed in log and is skipped" in caplog.text
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


def test_params_are_dotted_and_keys_sanitised():
    assert dict(flat_params({"a": {"b": {"c": 1}}, "d": [1, 2], "e": {}})) == {
        "a.b.c": "1",
        "d": "[1, 2]",
        "e": "{}",
    }
    assert metric_key("val/gsm8k@4/acc") == "val/gsm8k_4/acc"


def test_plugin_module_is_light():
    assert check_plugin_module("rlcore_mlflow.plugin") == {
        "logger/mlflow": "rlcore_mlflow.logger:MlflowLogger"
    }
