"""A NaN policy loss at steps 2, 3, 4 (the worker's ``RLCORE_TEST_NAN_AT_STEPS`` test hook).

Each such step is skipped by the engine and reported (``actor/nonfinite``,
``training/nonfinite_step``); the third in a row stops the run with one clear error and no
checkpoint of step 4. The last checkpoint (step 3) has finite weights, equal to step 1's
since steps 2 and 3 changed nothing. The run is a subprocess: its own Ray carries the env var
to the worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

RUNNER = """
import logging, sys
from pathlib import Path
from rlcore.config import load_config_text
from rlcore.errors import RlcoreError
from rlcore.ray_utils import start_ray
from rlcore.trainer import run_training

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
path = Path(sys.argv[1])
config = load_config_text(path.read_text(), source=str(path))
start_ray(config.resources)
try:
    sys.exit(run_training(config))
except RlcoreError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
"""


def _actor_weights(step_dir: Path) -> dict:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = step_dir.parent.parent / f"{step_dir.name}.pt"
    dcp_to_torch_save(step_dir / "actor", out)
    state = torch.load(out, weights_only=True)
    return state["model"]


def test_nan_loss_steps_are_skipped_reported_and_stop_the_run(tmp_path):
    import torch

    from rlcore.testing.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "model", hidden=64, layers=1, heads=2, kv_heads=1)
    train = tmp_path / "train.jsonl"
    with train.open("w") as fh:
        for i in range(8):
            row = {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
                "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            }
            fh.write(json.dumps(row) + "\n")
    run_dir = tmp_path / "run"
    config = tmp_path / "nan.toml"
    config.write_text(f"""
[data]
train_files = ["{train}"]
max_prompt_length = 64
max_response_length = 8
train_batch_size = 4

[model]
path = "{model}"

[actor]
micro_batch_size = 8
optim = {{ lr = 1e-3 }}

[rollout]
name = "hf"
n = 2

[reward]
default = ["gsm8k"]

[algorithm]
name = "grpo"

[trainer]
total_steps = 6
save_freq = 1
run_dir = "{run_dir}"
loggers = ["jsonl"]

[resources]
processes_per_node = 1
""")
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"OMP_NUM_THREADS": "1", "RLCORE_TEST_NAN_AT_STEPS": "2,3,4"}
    proc = subprocess.run(
        [sys.executable, str(runner), str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        start_new_session=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert (
        "error: 3 consecutive steps had a non-finite loss or gradient (last at step 4); "
        "stopping without saving the bad state"
    ) in proc.stderr

    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").open())}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[1]["training/nonfinite_step"] == 0.0
    for step in (2, 3, 4):
        assert rows[step]["training/nonfinite_step"] == 1.0, step
        assert rows[step]["actor/nonfinite"] == 1.0, step

    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "global_step_3"
    assert not (checkpoints / "global_step_4").exists()
    assert not (run_dir / "final_hf").exists()
    last, first = (
        _actor_weights(checkpoints / "global_step_3"),
        _actor_weights(checkpoints / "global_step_1"),
    )
    assert last
    for name, tensor in last.items():
        assert torch.isfinite(tensor).all(), name
        # Skipped updates leave the weights as they were after step 1.
        assert torch.equal(tensor, first[name]), name
