"""The scoring pool works from a driver script that has no ``if __name__ == "__main__":`` guard.

``forkserver``/``spawn`` children import the parent's main script; without the guard that
would re-run the script (a second training run) inside every reward worker. verl-style driver
scripts and rlcore's own ``TRAIN_SCRIPT`` are written without the guard.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    from rlcore.reward.pool import ScoringPool
    from rlcore_gsm8k.reward import GSM8KReward

    print("script body ran", flush=True)
    pool = ScoringPool({"gsm8k": GSM8KReward()}, num_workers=1, timeout_s=5.0)
    tasks = [(0, "gsm8k", "openai/gsm8k", "so #### 42", "42", None),
             (1, "gsm8k", "openai/gsm8k", "so #### 41", "42", None)]
    print("scores", [round(o[1], 3) for o in pool.run(tasks)], flush=True)
    pool.close()
    """
)


def test_pool_from_a_script_without_main_guard(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # The body ran once (in the driver only), and both rows were scored by the worker.
    assert out.stdout.count("script body ran") == 1, out.stdout
    assert "scores [1.0, 0.0]" in out.stdout, out.stdout + out.stderr[-2000:]
