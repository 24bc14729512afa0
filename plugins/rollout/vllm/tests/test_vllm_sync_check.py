"""scripts/gpu_check_sync.py (the GPU check of the FSDP2 -> vLLM weight sync) on the vLLM CPU
build: it passes with the sync (float32: |vLLM - trainer| log-prob ~3e-7 here) and FAILs when
the weights are not copied (``--break-sync``: ~0.5), so the check cannot pass a broken sync."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("need_vllm")

ROOT = Path(__file__).resolve().parents[4]


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/gpu_check_sync.py", "--device", "cpu", "--steps", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_the_sync_check_passes_a_real_sync_and_fails_a_broken_one():
    good = _check()
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "FSDP2 -> vLLM sync check passed" in good.stdout
    broken = _check("--break-sync")
    assert broken.returncode == 1, broken.stdout[-3000:] + broken.stderr[-3000:]
    assert "step 0: mean |vLLM - trainer| log-prob" in broken.stdout
