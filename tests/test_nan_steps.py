"""A NaN policy loss at steps 2, 3, 4: the non-finite handling end to end.

The run's driver script makes GRPO's advantages NaN on its 2nd, 3rd and 4th call (one call
per step, on the driver), so the policy loss is NaN with its graph intact; no hook in the
production code.

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

# Prepended to the run's driver script: NaN advantages at steps 2, 3 and 4.
NAN_ADVANTAGES = """
from rlcore_grpo.algorithm import GRPO

_compute = GRPO.compute_advantages
_calls = [0]


def _nan_at_some_steps(self, batch):
    out = _compute(self, batch)
    _calls[0] += 1
    if _calls[0] in (2, 3, 4):
        out.batch["advantages"] = out.batch["advantages"] * float("nan")
    return out


GRPO.compute_advantages = _nan_at_some_steps
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

    from rlcore.testing.runs import (
        TRAIN_SCRIPT,
        arithmetic_rows,
        tiny_run_model,
        tiny_run_toml,
        write_jsonl,
    )

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(arithmetic_rows([(i, 1) for i in range(8)]), tmp_path / "train.jsonl")
    run_dir = tmp_path / "run"
    config = tmp_path / "nan.toml"
    config.write_text(
        tiny_run_toml(model=model, train_files=[train], run_dir=run_dir, total_steps=6, save_freq=1)
    )
    runner = tmp_path / "runner.py"
    runner.write_text(NAN_ADVANTAGES + TRAIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"OMP_NUM_THREADS": "1"}
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
