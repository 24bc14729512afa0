"""scripts/gpu_check_sync.py (the GPU check of the FSDP2 -> vLLM weight sync) on the vLLM CPU
build: it passes with the sync (float32: |vLLM - trainer| log-prob ~3e-7 here) and FAILs when
the weights are not copied (``--break-sync``: ~0.5), so the check cannot pass a broken sync.
With ``--lora`` (a LoRA actor, ``lora_sync = "adapter"``) the same holds for the adapter-only
sync (|vLLM - trainer| ~2.5e-7, max ~1.4e-6; skipped: ~0.3), and each sync moves the adapter
only (524288 bytes here against 9985024 merged: printed, not timed)."""

from __future__ import annotations

import os
import re
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


@pytest.mark.parametrize("mode", [(), ("--lora",)], ids=["full", "lora-adapter"])
def test_the_sync_check_passes_a_real_sync_and_fails_a_broken_one(mode):
    good = _check(*mode)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-3000:]
    assert "FSDP2 -> vLLM sync check passed" in good.stdout
    sent = re.search(r"sync sent (\d+) bytes \((.+?)\); merged: (\d+) bytes", good.stdout)
    assert sent is not None, good.stdout[-3000:]
    print(sent.group(0))
    adapter_only = sent.group(2) == "adapter-only"
    assert adapter_only == bool(mode)
    assert (int(sent.group(1)) * 10 < int(sent.group(3))) == adapter_only
    broken = _check("--break-sync", *mode)
    assert broken.returncode == 1, broken.stdout[-3000:] + broken.stderr[-3000:]
    assert "step 0: mean |vLLM - trainer| log-prob" in broken.stdout
