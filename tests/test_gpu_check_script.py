"""scripts/gpu_check.sh on this CPU machine: every GPU check SKIPs and it exits 0; with
--require every SKIP is a FAIL and it exits 1 (a run that tested nothing cannot pass)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = [
    "fsdp2_hf_grpo",
    "device_pick",
    "megatron",
    "megatron_bf16",
    "sglang_rollout",
    "vllm_rollout",
    "fsdp2_vllm_sync",
    "fsdp2_vllm_ipc",
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def no_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script runs the real checks")


def test_every_check_skips_without_a_gpu_and_the_run_passes(no_cuda):
    run = _run()
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for name in CHECKS:
        assert f"SKIP {name}: no CUDA device" in lines
        assert any(line.split()[:2] == [name, "SKIP"] for line in lines)  # the table row
    assert "PASS" not in run.stdout
    assert "FAIL" not in run.stdout


def test_require_turns_every_skip_into_a_fail(no_cuda):
    run = _run("--require")
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    for name in CHECKS:
        assert f"FAIL {name}: no CUDA device" in lines
    assert not any(line.startswith("SKIP") for line in lines)
    assert f"{len(CHECKS)} FAIL" in lines[-1]
