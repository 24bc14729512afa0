"""``rollout.name = "vllm"`` through ``rlcore train``: the tiny run, in a subprocess."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("need_vllm")]


def test_tiny_run_trains_with_the_vllm_rollout(tmp_path, vllm_toml):
    run_dir = tmp_path / "run"
    text = vllm_toml(tmp_path, total_steps=3, val_files=[tmp_path / "train.jsonl"])
    config = tmp_path / "vllm.toml"
    config.write_text(text)
    # The CLI, as a user runs it (its own private Ray).
    cli = Path(sys.executable).with_name("rlcore")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(cli), "train", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        start_new_session=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").open())}
    assert {1, 2, 3} <= set(rows)
    for step in (1, 2, 3):
        assert rows[step]["timing_s/worker/generate"] > 0
        assert math.isfinite(rows[step]["actor/grad_norm"])
        assert rows[step]["response_length/mean"] > 0
        # vLLM's log-probs (asked for by default) against the FSDP2 engine's, float32.
        mean, most = rows[step]["rollout/logprob_diff_mean"], rows[step]["rollout/logprob_diff_max"]
        assert 0 <= mean <= most < 1e-3, (step, mean, most)
        print(f"step {step}: rollout/logprob_diff_mean {mean:.2e}, _max {most:.2e}")
    assert (run_dir / "final_hf" / "config.json").exists()
