"""Tracker: JSONL lines in the run directory, console bar and tables, TensorBoard if present."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import math
import re

import pytest
import torch

from rlcore.errors import PluginError
from rlcore.tracking import Tracker, format_table


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_lines_are_flushed_per_step_and_json_safe(tmp_path):
    tracker = Tracker(tmp_path / "run", ["jsonl"], total_steps=3)
    tracker.log({"critic/score/mean": 0.25, "timing_s/gen": torch.tensor(1.5)}, step=1)
    # readable before close: a crashed run keeps its metrics
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows == [{"step": 1, "critic/score/mean": 0.25, "timing_s/gen": 1.5}]
    tracker.log({"actor/pg_loss": math.nan, "val/arithmetic/acc": 0.5, "note": "x"}, step=2)
    tracker.close()
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[1] == {"step": 2, "actor/pg_loss": None, "val/arithmetic/acc": 0.5, "note": "x"}
    # a resumed run appends
    with Tracker(tmp_path / "run", ["jsonl"]) as again:
        again.log({"critic/score/mean": 0.5}, step=3)
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]


def test_console_shows_run_dir_progress_reward_and_tables(tmp_path, caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="rlcore.tracking"):
        tracker = Tracker(
            tmp_path,
            ["console"],
            total_steps=4,
            console_every=2,
            stream=stream,
            progress_bar=True,
        )
    assert f"run directory: {tmp_path.resolve()}" in caplog.text
    for step in range(1, 5):
        metrics = {"critic/score/mean": 0.1 * step, "actor/entropy": 1.25, "timing_s/step": 3.0}
        if step == 3:
            metrics["val/arithmetic/acc"] = 0.375
        tracker.log(metrics, step)
    tracker.close()
    out = stream.getvalue()
    assert f"rlcore: run directory {tmp_path.resolve()}" in out
    assert "reward=0.400" in out  # the bar's postfix
    assert "4/4" in out
    # tables at steps 2 and 4 (every 2) and 3 (validation)
    assert out.count("entropy") == 3
    assert "val/arithmetic/acc" in out
    assert not (tmp_path / "metrics.jsonl").exists()


def test_without_a_terminal_tables_carry_the_eta_and_no_bar_is_drawn(tmp_path):
    stream = io.StringIO()  # not a TTY: as when the output goes to a log file
    with Tracker(tmp_path, ["console"], total_steps=10, console_every=5, stream=stream) as t:
        for step in range(1, 11):
            t.log({"critic/score/mean": 0.5}, step)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("rlcore: run directory")
    assert "|" not in stream.getvalue()  # no bar
    assert lines[1].split() == ["step", "eta", "reward"]
    assert lines[2].split()[0] == "5/10"
    assert re.fullmatch(r"\d+:\d\d", lines[2].split()[1])
    assert lines[4].split()[:2] == ["10/10", "0:00"]


def test_format_table_aligns_the_key_metrics():
    text = format_table(5, {"critic/score/mean": 0.5, "perf/tokens_per_s": 1234.5}, 10)
    head, body = text.splitlines()
    assert head.split() == ["step", "reward", "tok/s"]
    assert body.split() == ["5/10", "0.5", "1234.5"]
    assert len(head) == len(body)


def test_unknown_logger_names_the_installed_ones(tmp_path):
    with pytest.raises(PluginError, match=r"unknown logger 'nosuch'.*Installed: console, jsonl"):
        Tracker(tmp_path, ["jsonl", "nosuch"])


def test_tensorboard_writes_events_or_says_why_not(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="rlcore.tracking"):
        tracker = Tracker(tmp_path, ["tensorboard"])
        tracker.log({"critic/score/mean": 0.5}, step=1)
        tracker.close()
    if importlib.util.find_spec("tensorboard") is None:
        assert "pip install tensorboard" in caplog.text
        assert not (tmp_path / "tensorboard").exists()
    else:
        assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
