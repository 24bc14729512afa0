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


def _train(
    tmp_path: Path, vllm_toml, *, total_steps: int, validate: bool = True, edit=lambda text: text
) -> dict[int, dict]:
    """The tiny run with ``[rollout] name = "vllm"`` (conftest's ``vllm_toml``; ``edit``
    changes its TOML), through the CLI as a user runs it (its own private Ray); its metrics
    rows by step."""
    run_dir = tmp_path / "run"
    val = [tmp_path / "train.jsonl"] if validate else []
    text = vllm_toml(tmp_path, total_steps=total_steps, val_files=val)
    config = tmp_path / "vllm.toml"
    config.write_text(edit(text))
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
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").open())}


def test_tiny_run_trains_with_the_vllm_rollout(tmp_path, vllm_toml):
    rows = _train(tmp_path, vllm_toml, total_steps=3)
    assert {1, 2, 3} <= set(rows)
    for step in (1, 2, 3):
        assert rows[step]["timing_s/worker/generate"] > 0
        assert math.isfinite(rows[step]["actor/grad_norm"])
        assert rows[step]["response_length/mean"] > 0
        # vLLM's log-probs (asked for by default) against the FSDP2 engine's, float32.
        mean, most = rows[step]["rollout/logprob_diff_mean"], rows[step]["rollout/logprob_diff_max"]
        assert 0 <= mean <= most < 1e-3, (step, mean, most)
        print(f"step {step}: rollout/logprob_diff_mean {mean:.2e}, _max {most:.2e}")
    assert (tmp_path / "run" / "final_hf" / "config.json").exists()


def _model_bytes(folder: Path, rank: int) -> tuple[int, int]:
    """(bytes of the float32 model, bytes of a rank-``rank`` float32 adapter on every linear
    layer of the decoder: ``A`` (r, in) and ``B`` (out, r) per ``*_proj.weight``)."""
    from safetensors import safe_open

    model = adapter = 0
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            for name in names:
                shape = f.get_slice(name).get_shape()
                model += 4 * math.prod(shape)
                if name.endswith("_proj.weight"):
                    adapter += 4 * rank * (shape[0] + shape[1])
    return model, adapter


def test_lora_run_syncs_only_the_adapter_and_vllm_serves_it(tmp_path, vllm_toml):
    """``lora_sync = "adapter"``: each sync moves the adapter (bytes in the metrics), and
    vLLM's log-probs under the served adapter equal the LoRA actor's."""
    lora = '\n[actor.engine]\nname = "fsdp2"\nlora_rank = 8\nlora_alpha = 16.0\n'
    adapter = 'lora_sync = "adapter"\nmax_lora_rank = 8\n'
    rows = _train(
        tmp_path,
        vllm_toml,
        total_steps=2,
        validate=False,
        edit=lambda t: t.replace("kv_cache_space_gb", adapter + "kv_cache_space_gb") + lora,
    )
    merged, adapter_bytes = _model_bytes(tmp_path / "model", rank=8)
    for step in (1, 2):
        sent = rows[step]["perf/weight_sync_bytes"]
        assert sent == adapter_bytes < merged / 5, (step, sent, adapter_bytes, merged)
        mean, most = rows[step]["rollout/logprob_diff_mean"], rows[step]["rollout/logprob_diff_max"]
        # step 2 generates under the adapter step 1 trained and synced
        assert 0 <= mean <= most < 1e-5, (step, mean, most)
        print(
            f"step {step}: sync {sent:.0f} bytes (adapter) vs {merged} (merged), "
            f"rollout/logprob_diff_max {most:.2e}"
        )
