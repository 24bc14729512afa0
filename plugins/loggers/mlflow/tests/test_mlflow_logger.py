"""The MLflow logger for real, on a local SQLite store: metrics read back equal metrics.jsonl."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rlcore.errors import ConfigError
from rlcore.interfaces import RunInfo
from rlcore.testing.conformance import check_plugin_module
from rlcore.testing.servers import closed_port_url, silent_server
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


# --- a tracking server that never answers, and one that is closed --------------------------

BOUND_S = 2.0  # [trainer] logger_timeout_s of these tests


@pytest.fixture(params=["silent", "closed"])
def dead_server(request):
    """The URL of a server that accepts connections and never answers, or of a closed port."""
    if request.param == "closed":
        yield closed_port_url()
        return
    with silent_server() as url:
        yield url


# What the check says of each (the fixture's order).
CAUSES = {
    "closed": "connection refused: nothing listens there",
    "silent": f"no answer within {BOUND_S:g} s (trainer.logger_timeout_s)",
}


def test_a_dead_server_is_one_line_before_ray(tmp_path, dead_server, request):
    run = RunInfo(run_dir=tmp_path / "run", experiment_name="exp")
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        MlflowLogger.check(run, MlflowLogger.Config(tracking_uri=dead_server), BOUND_S)
    took = time.monotonic() - start
    print(f"{dead_server}: refused in {took:.2f} s (bound {BOUND_S:g} s)")
    cause = CAUSES[request.node.callspec.params["dead_server"]]
    assert str(info.value) == (
        f"trainer.logger_options.mlflow.tracking_uri = {dead_server!r}: {cause}; start the "
        "tracking server, fix trainer.logger_options.mlflow.tracking_uri or drop mlflow from "
        "trainer.loggers (checked before Ray starts)"
    )
    assert took < BOUND_S + 5  # generous: the machine is shared


def test_a_server_that_answers_passes_the_check(tmp_path):
    """Any HTTP answer (here a 404 from a plain HTTP server) shows the server is there."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        run = RunInfo(run_dir=tmp_path / "run", experiment_name="exp")
        MlflowLogger.check(run, MlflowLogger.Config(tracking_uri=url), BOUND_S)
    finally:
        server.shutdown()
        server.server_close()


def test_a_dead_server_costs_its_metrics_never_the_run(tmp_path, dead_server, caplog):
    """The real MLflow client against the dead server (it would retry with back-off for
    minutes): its start is given up after the bound, every step still reaches metrics.jsonl
    with the count of what MLflow missed, and nothing waits again."""
    run_dir = tmp_path / "run"
    options = {"mlflow": MlflowLogger.Config(tracking_uri=dead_server)}
    start = time.monotonic()
    with Tracker(run_dir, ["jsonl", "mlflow"], logger_options=options, timeout_s=BOUND_S) as t:
        started = time.monotonic() - start
        for step, metrics in enumerate(STEPS, start=1):
            t.log(metrics, step)
    took = time.monotonic() - start
    print(f"{dead_server}: start given up after {started:.2f} s, the run's tracking {took:.2f} s")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert [row["tracker/mlflow/dropped"] for row in rows] == [1, 2, 3]  # its start, then steps
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w for w in warnings if "did not answer" in w] == [
        f"logger 'mlflow' did not answer its start within {BOUND_S:g} s "
        "(trainer.logger_timeout_s); the run goes on and its metrics are dropped (counted in "
        "tracker/mlflow/dropped) until it answers"
    ]
    assert f"logger 'mlflow' missed 4 call(s) (no answer within {BOUND_S:g} s" in caplog.text
    assert took < BOUND_S + 10  # one bound, not one per step; generous: the machine is shared
