"""examples/quickstart/seeds.py: the per-seed table, the spread and the verdict, from run dirs.

The runs here are folders written the way run.sh and the trainer write them (metrics.jsonl,
quickstart_times.json, warm_start.json); the real 3-seed measurement is the script itself.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def seeds():
    spec = importlib.util.spec_from_file_location(
        "quickstart_seeds", REPO / "examples/quickstart/seeds.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def fake_seed(root: Path, work: Path, seed: int, curve: dict[int, float], train_s: int) -> None:
    run = root / f"seed{seed}"
    run.mkdir(parents=True)
    rows = [
        {"step": s, "val/arithmetic/acc": acc, "val/arithmetic/score": acc}
        for s, acc in curve.items()
    ]
    rows += [{"step": s, "critic/score/mean": 0.5} for s in range(1, max(curve) + 1)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "quickstart_times.json").write_text(
        json.dumps({"seed": seed, "prepare_s": 200 + seed, "train_s": train_s})
    )
    sft = work / f"seed{seed}" / "model_sft"
    sft.mkdir(parents=True)
    (sft / "warm_start.json").write_text(json.dumps({"steps": 500 + seed, "dev_acc": 0.31}))


def test_report_has_a_row_per_seed_the_curves_and_the_spread(seeds, tmp_path, capsys):
    root, work = tmp_path / "runs", tmp_path / "work"
    fake_seed(root, work, 0, {0: 0.27, 10: 0.40, 20: 0.52}, train_s=400)
    fake_seed(root, work, 1, {0: 0.30, 10: 0.45, 20: 0.61}, train_s=420)
    code = seeds.main(["--report", str(root), "--work-dir", str(work)])
    out = capsys.readouterr().out
    assert code == 0
    assert "| 0 | 500 | 31.0 | 27.0 | 52.0 | 25.0 | 46.0 | 200 | 400 | - |" in out
    assert "| 1 | 501 | 31.0 | 30.0 | 61.0 | 31.0 | 53.0 | 201 | 420 | - |" in out
    assert "| 10 | 40.0 | 45.0 |" in out  # the curves side by side
    assert "gain 25.0-31.0 points" in out
    assert "final 52.0-61.0 %" in out
    assert "training 400-420 s" in out
    assert (root / "summary.md").read_text() in out


def test_a_seed_that_gains_too_little_or_trains_too_long_fails(seeds, tmp_path, capsys):
    root, work = tmp_path / "runs", tmp_path / "work"
    fake_seed(root, work, 0, {0: 0.27, 10: 0.42}, train_s=300)  # +15: the run
    fake_seed(root, work, 1, {0: 0.27, 10: 0.60}, train_s=700)  # gains, but > 10 minutes
    fake_seed(root, work, 2, {0: 0.27, 10: 0.60}, train_s=300)
    assert seeds.main(["--report", str(root), "--work-dir", str(work)]) == 1
    out = capsys.readouterr().out
    assert "seed 0: gain 15.0 < 20 points" in out
    assert "seed 1: training 700 s > 10 min" in out
    assert "seed 2:" not in out


def test_a_run_without_validation_after_step_0_has_no_gain(seeds, tmp_path):
    root, work = tmp_path / "runs", tmp_path / "work"
    fake_seed(root, work, 0, {0: 0.27}, train_s=10)
    result = seeds.collect(0, root / "seed0", work)
    assert result.start_acc == 0.27
    assert result.gain is None
    assert seeds.verdict([result], 0.2, 10) == 1


def test_a_new_measurement_refuses_a_used_root(seeds, tmp_path):
    (tmp_path / "seed0").mkdir()
    with pytest.raises(SystemExit):
        seeds.main(["--root", str(tmp_path)])
