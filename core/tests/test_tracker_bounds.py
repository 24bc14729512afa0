"""Every call of a logger is bounded (``[trainer] logger_timeout_s``): a tracker that stops
answering mid-run costs its own metrics (counted, one warning), never the run, and gets them
again once it answers. The logger here is a test double for a service that hangs; the real
MLflow client against a silent and a closed server is in plugins/loggers/mlflow/tests."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from rlcore.interfaces import BaseLogger, RunInfo
from rlcore.tracking import Tracker

BOUND_S = 0.5


class HangingLogger(BaseLogger):
    """Records what it is given; while ``hang`` is set, a call waits until ``answer`` is."""

    def __init__(self) -> None:
        super().__init__(RunInfo(run_dir=Path("."), experiment_name="x"))
        self.hang = threading.Event()
        self.answer = threading.Event()
        self.steps: list[int] = []

    def log(self, metrics, step):
        if self.hang.is_set():
            self.answer.wait(30)
        self.steps.append(step)


def test_a_logger_that_stops_answering_costs_its_metrics_not_the_run(tmp_path, caplog):
    hanging = HangingLogger()
    run_dir = tmp_path / "run"
    start = time.monotonic()
    with Tracker(run_dir, ["jsonl", hanging], timeout_s=BOUND_S) as tracker:
        tracker.log({"a": 1.0}, 1)
        hanging.hang.set()  # the service stops answering
        for step in (2, 3, 4):
            tracker.log({"a": float(step)}, step)
        took = time.monotonic() - start
        hanging.hang.clear()
        hanging.answer.set()  # it answers again: the late call returns
        deadline = time.monotonic() + 10
        while tracker._entries[1].late.running and time.monotonic() < deadline:
            time.sleep(0.01)
        tracker.log({"a": 5.0}, 5)
    print(f"steps 2-4 with a hung logger took {took:.2f} s (bound {BOUND_S} s)")
    assert took < BOUND_S + 5  # one bound (step 2), steps 3 and 4 do not wait
    assert hanging.steps == [1, 2, 5]  # step 2 arrived late; 3 and 4 were dropped
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]  # the run's record is whole
    assert [row.get("tracker/HangingLogger/dropped") for row in rows] == [None, None, 1, 2, 3]
    hung = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert hung == [
        f"logger 'HangingLogger' did not answer log within {BOUND_S:g} s "
        "(trainer.logger_timeout_s); the run goes on and its metrics are dropped (counted in "
        "tracker/HangingLogger/dropped) until it answers"
    ]
    assert "logger 'HangingLogger' missed 3 call(s)" in caplog.text


def test_a_logger_that_raises_is_still_skipped_at_once(tmp_path, caplog):
    class Broken(BaseLogger):
        def log(self, metrics, step):
            raise ConnectionError("service down")

    broken = Broken(RunInfo(run_dir=tmp_path, experiment_name="x"))
    with Tracker(tmp_path / "run", ["jsonl", broken], timeout_s=BOUND_S) as tracker:
        tracker.log({"a": 1.0}, 1)
        tracker.log({"a": 2.0}, 2)
    assert caplog.text.count("logger 'Broken' failed in log and is skipped") == 1
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
