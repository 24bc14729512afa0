"""vLLM as the rollout on a resource pool of its own, one-step-off (docs/placement.md), through
``run_training`` (the test session's Ray) on CPU: the trainer (FSDP2, ``global_pool``) and
the vLLM engine (pool ``gen``) are separate processes, and the trainer's weights reach vLLM
over the weight bridge (gloo) after every update.

Two steps one-step-off (staleness 0 then 1), a checkpoint, then a resume: the resumed step
generates synchronously with the restored weights, which reach the vLLM engine only through
the sync across pools (vLLM loaded the starting model from ``model.path``). Its log-probs
must then equal the trainer's to the float32 bound of the other vLLM sync checks; with the
sync skipped they are two updates apart (~0.5 here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("need_vllm")]

IN_SYNC = 1e-3  # |vLLM - trainer| log-prob, float32 (scripts/gpu_check_sync.py, test_vllm_train)
STALE = 1e-2  # one lr = 1e-2 update with an entropy bonus moves them by far more

PLACED = 'placement = { rollout = "gen" }\n[resources.pools.gen]\nprocesses_per_node = 1\n'


def _train(text: str) -> dict[int, dict]:
    from rlcore.config import load_config_text
    from rlcore.trainer import run_training

    config = load_config_text(text, source="placed.toml")
    assert config.resources.pool_of("rollout") == "gen"
    assert run_training(config) == 0
    lines = (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "actor/pg_loss" in r}


def test_one_step_off_with_vllm_on_its_own_pool_syncs_weights_into_vllm(
    ray_session, tmp_path, vllm_toml
):
    text = vllm_toml(
        tmp_path,
        total_steps=2,
        save_freq=2,
        lr=1e-2,
        # An entropy bonus moves the weights even where every reward is 0 (the tiny model).
        algorithm_options='rollout_is = "token"\nentropy_coeff = 0.1',
        extra=PLACED,
    ).replace("[trainer]\n", '[trainer]\nasync_mode = "one_step_off"\n', 1)

    rows = _train(text)
    steps = [rows[s] for s in (1, 2)]
    assert [r["weight_sync/version"] for r in steps] == [1.0, 2.0]
    # Step 1 generates synchronously; step 2 trains what vLLM generated during step 1.
    assert [r["rollout/weight_version"] for r in steps] == [0.0, 0.0]
    assert [r["training/staleness"] for r in steps] == [0.0, 1.0]
    diffs = [r["rollout/logprob_diff_max"] for r in steps]
    assert diffs[0] < IN_SYNC, diffs
    assert diffs[1] > STALE, diffs  # one version behind: the update really moved the policy
    assert all(r["weight_sync/bytes"] > 0 for r in steps)

    # Resume from global_step_2: the trainer restores version 2 and sends it across the pools
    # to the freshly started vLLM engine, which then generates the step synchronously.
    resumed = _train(text.replace("total_steps = 2", "total_steps = 3", 1))[3]
    assert resumed["training/staleness"] == 0.0
    assert resumed["rollout/weight_version"] == 2.0
    synced = resumed["rollout/logprob_diff_max"]
    assert synced < IN_SYNC, (synced, diffs)
    print(f"\nlogprob_diff_max: step 1 {diffs[0]:.2e}, step 2 (one-step-off) {diffs[1]:.2e}, "
          f"resumed step 3 after the sync {synced:.2e}")  # fmt: skip
