"""The example third-party engine: conformance, FSDP2-equal log-probs, training by config.

The package is installed as its own distribution (``requirements-dev.txt``), so ``name =
"torch"`` in ``[actor.engine]`` reaches it through the real entry-point discovery.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.distributed as dist

from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.testing.conformance import check_engine, check_plugin_module
from rlcore.testing.conformance._engine import random_engine_batch
from rlcore_torch_engine.engine import TorchEngine

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.runs import tiny_run_model

    return str(tiny_run_model(tmp_path_factory.mktemp("torch_engine") / "model"))


def test_plugin_module_is_light_and_registered():
    assert check_plugin_module("rlcore_torch_engine.plugin") == {
        "engine/torch": "rlcore_torch_engine.engine:TorchEngine"
    }


def test_conformance(tiny_path):
    check_engine(TorchEngine, model_path=tiny_path)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_log_probs_equal_fsdp2_on_the_same_weights(tiny_path, temperature):
    from rlcore_fsdp2.engine import FSDP2Engine

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        spec = EngineSpec(role="actor", model_path=tiny_path, optim=OptimConfig(lr=1e-2))
        ours, fsdp2 = TorchEngine(spec), FSDP2Engine(spec)
        batch = random_engine_batch(int(ours.model.config.vocab_size))
        mask = batch.batch["response_mask"].bool()
        a = ours.compute_log_prob(batch, temperature=temperature, with_entropy=True)
        b = fsdp2.compute_log_prob(batch, temperature=temperature, with_entropy=True)
        torch.testing.assert_close(a.log_probs[mask], b.log_probs[mask], atol=1e-5, rtol=0)
        torch.testing.assert_close(a.entropy[mask], b.entropy[mask], atol=1e-5, rtol=0)
    finally:
        if created:
            dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_trains_the_tiny_run_through_the_config(ray_session, tiny_path, tmp_path, temperature):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    train = write_jsonl(arithmetic_rows([(a, 2) for a in range(8)]), tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=tiny_path,
        train_files=[train],
        run_dir=tmp_path / "run",
        experiment_name=f"torch-engine-{temperature}",
        extra="",
    )
    config = load_config_text(
        text,
        source="torch_engine.toml",
        overrides=['actor.engine.name="torch"', f"rollout.temperature={temperature}"],
    )
    assert config.actor.engine.name == "torch"
    assert run_training(config) == 0
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["actor/pg_loss"])
        assert row["actor/lr"] == pytest.approx(1e-3)  # logged from the core's schedule
    assert (tmp_path / "run" / "final_hf" / "config.json").is_file()
