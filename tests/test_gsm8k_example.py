"""examples/gsm8k: the converter on the real files (jsonl and parquet) and the CPU smoke run.

The smoke run is ``rlcore train examples/gsm8k/smoke.toml`` for 2 steps on the real GSM8K rows
with the tiny random model, only the paths pointed at a temporary folder.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data" / "gsm8k"
EXAMPLE = REPO / "examples" / "gsm8k"

pytestmark = pytest.mark.skipif(
    not (DATA / "test.jsonl").exists(), reason=f"real GSM8K not found under {DATA}"
)


@pytest.fixture(scope="module")
def gsm8k():
    spec = importlib.util.spec_from_file_location("gsm8k_prep", REPO / "examples/data/gsm8k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def converted(gsm8k, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gsm8k_rows")
    assert gsm8k.prepare(DATA, out) == {"train": 7473, "test": 1319}
    return out


def test_parquet_in_hugging_faces_layout_converts_like_the_jsonl(gsm8k, converted, tmp_path):
    # openai/gsm8k on the Hub ships main/{train,test}-00000-of-00001.parquet (question, answer).
    hub = tmp_path / "hub" / "main"
    hub.mkdir(parents=True)
    for split in gsm8k.SPLITS:
        raw = [json.loads(line) for line in (DATA / f"{split}.jsonl").open()]
        pq.write_table(pa.Table.from_pylist(raw), hub / f"{split}-00000-of-00001.parquet")
    assert gsm8k.split_file(hub.parent, "test").name == "test-00000-of-00001.parquet"
    out = tmp_path / "out"
    assert gsm8k.prepare(hub.parent, out) == {"train": 7473, "test": 1319}
    for split in gsm8k.SPLITS:
        assert (
            pq.read_table(out / f"{split}.parquet").to_pylist()
            == pq.read_table(converted / f"{split}.parquet").to_pylist()
        )


def test_a_parquet_without_the_fields_names_file_and_row(gsm8k, tmp_path):
    pq.write_table(
        pa.Table.from_pylist([{"question": "q", "answer": "#### 1"}]), tmp_path / "train.parquet"
    )
    pq.write_table(pa.Table.from_pylist([{"problem": "q"}]), tmp_path / "test.parquet")
    with pytest.raises(gsm8k.DataError, match=r"test\.parquet:1: missing string field 'question'"):
        gsm8k.prepare(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_cpu_smoke_config_trains_two_steps_on_real_gsm8k(
    ray_session, converted, tmp_path, capsys
):
    from rlcore.cli import main as rlcore_main
    from rlcore.testing.runs import tiny_run_model

    model = tiny_run_model(tmp_path / "tiny_model")
    run = tmp_path / "run"
    overrides = [
        f"model.path={json.dumps(str(model))}",
        f"data.train_files=[{json.dumps(str(converted / 'train.parquet'))}]",
        f"data.val_files=[{json.dumps(str(converted / 'test.parquet'))}]",
        f"trainer.run_dir={json.dumps(str(run))}",
    ]
    assert rlcore_main(["train", str(EXAMPLE / "smoke.toml"), *overrides]) == 0, (
        capsys.readouterr().err
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    last = rows[-1]
    # The real prompts, the GSM8K reward and the KL loss's reference all ran.
    for key in (
        "critic/score/mean",
        "actor/kl_loss",
        "response_length/mean",
        "val/openai/gsm8k/acc",
    ):
        assert key in last, key
        assert math.isfinite(last[key]), key
    assert last["prompt_length/min"] > 80  # question + instruction, one token per character
    assert (run / "final_hf" / "config.json").is_file()
    pytest.importorskip("matplotlib")
    assert (run / "plots" / "summary.png").is_file()
