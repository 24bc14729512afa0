"""examples/data/{gsm8k,math}.py on the real files: verl's row schema, counts, errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
SCRIPTS = REPO / "examples" / "data"

pytestmark = pytest.mark.skipif(
    not (DATA / "gsm8k" / "test.jsonl").exists(), reason=f"real data not found under {DATA}"
)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"rlcore_example_data_{name}", SCRIPTS / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def check_schema(row: dict, data_source: str, suffix: str) -> None:
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == data_source
    assert row["ability"] == "math"
    (message,) = row["prompt"]
    assert message["role"] == "user"
    assert message["content"].endswith(" " + suffix)
    assert row["reward_model"]["style"] == "rule"
    assert isinstance(row["reward_model"]["ground_truth"], str)
    assert row["reward_model"]["ground_truth"]
    assert {"split", "index"} <= set(row["extra_info"])


# --- gsm8k ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gsm8k_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("gsm8k")
    proc = run_script("gsm8k", "--input-dir", str(DATA / "gsm8k"), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "wrote 7473 rows" in proc.stdout
    return out


def test_gsm8k_rows_follow_verls_schema(gsm8k_out):
    gsm8k = load_script("gsm8k")
    for split, n in (("train", 7473), ("test", 1319)):
        rows = pq.read_table(gsm8k_out / f"{split}.parquet").to_pylist()
        assert len(rows) == n
        raw = [json.loads(line) for line in (DATA / "gsm8k" / f"{split}.jsonl").open()]
        for index, (row, item) in enumerate(zip(rows, raw)):
            check_schema(row, "openai/gsm8k", gsm8k.INSTRUCTION)
            assert row["prompt"][0]["content"] == f"{item['question']} {gsm8k.INSTRUCTION}"
            assert row["extra_info"] == {
                "split": split,
                "index": index,
                "answer": item["answer"],
                "question": item["question"],
            }
            truth = row["reward_model"]["ground_truth"]
            assert "," not in truth
            assert item["answer"].replace(",", "").endswith(f"#### {truth}")


def test_gsm8k_prepared_rows_score_one_with_the_reward(gsm8k_out):
    rlcore_gsm8k = pytest.importorskip("rlcore_gsm8k")
    reward = rlcore_gsm8k.GSM8KReward()
    rows = pq.read_table(gsm8k_out / "test.parquet").to_pylist()
    scores = [
        reward.score(r["data_source"], r["extra_info"]["answer"], r["reward_model"]["ground_truth"])
        for r in rows
    ]
    assert sum(s["score"] for s in scores) == len(rows) == 1319


def test_gsm8k_missing_file_is_one_clear_line(tmp_path):
    proc = run_script("gsm8k", "--input-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: GSM8K file not found: ")
    assert "train.jsonl" in proc.stderr
    assert proc.stderr.count("\n") == 1  # no traceback


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "q"}', r":1: missing string field 'answer'"),
        ('{"question": "q", "answer": "no marker"}', r":1: 'answer' has no '#### <number>'"),
        ("{not json", r":1: not a JSON object per line"),
    ],
)
def test_gsm8k_bad_rows_name_file_and_line(tmp_path, line, message):
    gsm8k = load_script("gsm8k")
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    (tmp_path / "test.jsonl").write_text(line + "\n")
    with pytest.raises(gsm8k.DataError, match="test.jsonl" + message):
        gsm8k.prepare(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


# --- math -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def math_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("math")
    # Run as a script: it is named math.py and must not shadow the standard library's math.
    proc = run_script("math", "--input-dir", str(DATA / "math"), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize(
    ("name", "count"), [("math500", 500), ("minerva_math", 272), ("amc23", 40), ("aime24", 30)]
)
def test_math_rows_follow_verls_schema(math_out, name, count):
    math_prep = load_script("math")
    rows = pq.read_table(math_out / name / "test.parquet").to_pylist()
    raw = [json.loads(line) for line in (DATA / "math" / name / "test.jsonl").open()]
    assert len(rows) == len(raw) == count
    for index, (row, item) in enumerate(zip(rows, raw)):
        check_schema(row, name, math_prep.INSTRUCTION)
        assert row["extra_info"]["index"] == index
        assert row["extra_info"]["split"] == "test"
        assert row["prompt"][0]["content"].startswith(item["problem"])
        truth = row["reward_model"]["ground_truth"]
        if "answer" in item:
            assert truth == math_prep.answer_text(item["answer"])
        else:  # minerva: the solution's last \boxed{}
            assert "\\boxed{" + truth in item["solution"].replace("\\boxed{ ", "\\boxed{")


def test_math_ground_truths_by_dataset(math_out):
    first = {
        name: pq.read_table(math_out / name / "test.parquet").slice(0, 1).to_pylist()[0]
        for name in ("math500", "minerva_math", "amc23", "aime24")
    }
    assert first["math500"]["reward_model"]["ground_truth"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first["minerva_math"]["reward_model"]["ground_truth"] == "1.6"
    assert first["amc23"]["reward_model"]["ground_truth"] == "27"  # 27.0 in the file
    assert first["aime24"]["reward_model"]["ground_truth"] == "204"


def test_math_last_boxed_balances_braces():
    math_prep = load_script("math")
    assert math_prep.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert math_prep.last_boxed("\\fbox{x}") == "x"
    assert math_prep.last_boxed("\\boxed{\\frac{1}{2}") is None
    assert math_prep.last_boxed("no box") is None


def test_math_single_dataset_and_errors(tmp_path):
    proc = run_script(
        "math",
        "--dataset",
        "amc23",
        "--input-dir",
        str(DATA / "math"),
        "--output-dir",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["amc23"]
    proc = run_script("math", "--input-dir", str(tmp_path / "nope"), "--output-dir", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: math data file not found: ")
    assert proc.stderr.count("\n") == 1

    math_prep = load_script("math")
    bad = tmp_path / "bad" / "minerva_math"
    bad.mkdir(parents=True)
    (bad / "test.jsonl").write_text('{"problem": "p", "solution": "no box here"}\n')
    with pytest.raises(math_prep.DataError, match=r"test.jsonl:1: no 'answer', and 'solution'"):
        math_prep.prepare(["minerva_math"], tmp_path / "bad", tmp_path / "out")
    (bad / "test.jsonl").write_text('{"question_text": "p", "answer": "1"}\n')
    with pytest.raises(math_prep.DataError, match=r"missing string field 'problem'"):
        math_prep.prepare(["minerva_math"], tmp_path / "bad", tmp_path / "out")
