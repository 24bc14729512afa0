"""``rlcore train`` with megatron actor, critic and reference engines on 2 processes.

Two layouts: DP=2 (``tensor_parallel = 1``) and TP=2 (``tensor_parallel = 2``: one
data-parallel group, so the role workers go through the mesh dispatch and the driver lays the
update rows out for one data-parallel rank). PPO with a KL loss for 2 steps on the tiny run, a
checkpoint every step. Against the same run on FSDP2 (DP=2): the step-1 metrics agree (same
rollouts, same gradients). Resumed from its step-1 checkpoint, the run ends with a
bit-identical final actor; ``rlcore export`` of the megatron checkpoint (on one process, the
TP=2 shards merged) loads in transformers with the final actor's logits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

STEPS = 2
# layout name -> tensor_parallel of every megatron engine (actor, critic, reference)
LAYOUTS = {"dp2": 1, "tp2": 2}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, write_jsonl, write_train_script
    from rlcore.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("megatron_run")
    # The tiny run's model with 2 KV heads, so that tensor_parallel = 2 divides them.
    model = build_tiny_model(root / "model", hidden=64, layers=1, heads=2, kv_heads=2)
    rows = arithmetic_rows([(a, 2) for a in range(8)])
    return root, model, write_jsonl(rows, root / "train.jsonl"), write_train_script(root / "run.py")


def _engines(engine: str, tensor_parallel: int = 1) -> str:
    option = f"tensor_parallel = {tensor_parallel}\n" if tensor_parallel > 1 else ""
    return "".join(
        f'[{role}.engine]\nname = "{engine}"\n{option}\n' for role in ("actor", "critic")
    )


def _train(assets, name: str, engines: str, *, before=None) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    root, model, train, script = assets
    run_dir = root / name
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=run_dir,
        algorithm="ppo",
        algorithm_options="use_kl_loss = true",
        critic_lr=1e-3,
        total_steps=STEPS,
        micro_batch_size=2,
        save_freq=1,
        seed=7,
        processes_per_node=2,
        extra=engines,
    )
    config = root / f"{name}.toml"
    config.write_text(text)
    if before is not None:
        before(run_dir)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(script), str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=500,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


def _metrics(run_dir: Path) -> list[dict]:
    """Every logged step, from ``metrics.jsonl`` and any timestamped ``metrics.*.jsonl``."""
    lines = [
        line for f in sorted(run_dir.glob("metrics*.jsonl")) for line in f.read_text().splitlines()
    ]
    return sorted((json.loads(line) for line in lines), key=lambda m: m["step"])


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def megatron_run(assets, layout):
    return _train(assets, f"megatron_{layout}", _engines("megatron", LAYOUTS[layout]))


@pytest.fixture(scope="module")
def fsdp2_run(assets):
    return _train(assets, "fsdp2", _engines("fsdp2"))


def test_first_step_matches_fsdp2(megatron_run, fsdp2_run):
    got, expected = _metrics(megatron_run)[0], _metrics(fsdp2_run)[0]
    assert got["step"] == expected["step"] == 1
    for key in ("actor/grad_norm", "critic/grad_norm", "critic/vf_loss", "actor/entropy"):
        assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
    assert got["actor/nonfinite"] == got["critic/nonfinite"] == 0.0


def test_resume_from_step_1_is_bit_identical(assets, layout, megatron_run):
    def seed_with_step_1(run_dir: Path) -> None:
        checkpoints = run_dir / "checkpoints"
        checkpoints.mkdir(parents=True)
        shutil.copytree(
            megatron_run / "checkpoints" / "global_step_1", checkpoints / "global_step_1"
        )
        (checkpoints / "latest").write_text("global_step_1")

    engines = _engines("megatron", LAYOUTS[layout])
    resumed = _train(assets, f"resumed_{layout}", engines, before=seed_with_step_1)
    assert [m["step"] for m in _metrics(resumed)] == [2]  # it really resumed after step 1
    expected, got = _weights(megatron_run / "final_hf"), _weights(resumed / "final_hf")
    assert set(got) == set(expected)
    assert all(torch.equal(got[n], expected[n]) for n in expected)


def test_rlcore_export_of_the_checkpoint_loads_in_transformers(assets, megatron_run, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "exported"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "export", str(megatron_run), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    final = AutoModelForCausalLM.from_pretrained(megatron_run / "final_hf", dtype=torch.float32)
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (exported(input_ids=ids).logits - final.eval()(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-5
