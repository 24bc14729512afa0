"""Model FLOPs and MFU (rlcore.tracking.flops): the count on hand-worked cases, the per-step
count from a batch's masks, and the measured peak's cache."""

from __future__ import annotations

import json

import pytest
import torch

from rlcore.protocol import DataProto
from rlcore.tracking.flops import (
    ModelShape,
    causal_keys,
    declared_peak_flops,
    measured_peak_flops,
    mfu_metrics,
    step_model_flops,
)

SHAPE = ModelShape(layers=2, hidden=4, q_width=4, kv_width=2, intermediate=8, vocab=10)


def test_the_forward_count_by_hand():
    # one layer's linear weights: q,o 4x4 each, k,v 4x2 each, the MLP 3 x 4x8 = 32+16+96 = 144
    assert SHAPE.layer_params == 144
    # 3 tokens seeing 1+2+3 = 6 keys, the head on 2 of them:
    # 2 layers x (2 x 144 x 3 + 4 x 4 x 6) + 2 x 4 x 10 x 2 = 2 x (864 + 96) + 160 = 2080
    assert causal_keys(3) == 6
    assert SHAPE.forward(3, causal_keys(3), 2) == 2080
    assert causal_keys(2, before=3) == 2 * 3 + 3  # tokens 4 and 5 see 4 and 5 keys


def test_a_steps_flops_come_from_each_rows_unpadded_lengths():
    # Row 0: 2 prompt tokens (left-padded by 1) + 1 response token (then 1 pad): 3 tokens.
    # Row 1: 3 prompt tokens + 2 response tokens: 5 tokens.
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    batch = DataProto.from_dict(
        tensors={"attention_mask": mask, "responses": torch.zeros(2, 2, dtype=torch.long)}
    )
    got = step_model_flops(SHAPE, batch)
    forward = SHAPE.forward(3 + 5, causal_keys(3) + causal_keys(5), head_tokens=1 + 2)
    assert got == {"update": 3 * forward, "generate": forward}
    assert step_model_flops(SHAPE, DataProto.from_dict(tensors={"x": torch.zeros(2, 1)})) == {}


def test_mfu_is_the_phase_flops_over_worker_time_and_every_process_peak():
    metrics = {
        "timing_s/worker/actor_forward_backward": 1.5,
        "timing_s/worker/actor_optimizer": 0.5,
        "timing_s/worker/generate": 4.0,
    }
    out = mfu_metrics(
        {"update": 8e9, "generate": 2e9}, metrics, 1e9, {"update": 2, "generate": 1}
    )
    assert out["perf/mfu/update"] == pytest.approx(8e9 / (2.0 * 2e9))  # 2 processes
    assert out["perf/mfu/generate"] == pytest.approx(2e9 / (4.0 * 1e9))
    assert out["perf/model_tflops/update"] == pytest.approx(8e-3)
    # no worker time for a phase (a custom step program): its FLOPs, no MFU
    assert "perf/mfu/update" not in mfu_metrics({"update": 1.0}, {}, 1e9, {"update": 1})


def test_the_peak_is_measured_once_per_machine_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCORE_CACHE_DIR", str(tmp_path))
    shape = ModelShape(layers=1, hidden=64, q_width=64, kv_width=64, intermediate=128, vocab=8)
    first = measured_peak_flops(shape, threads=1)
    assert first > 1e6  # FLOP/s: any CPU does more than a million
    cache = tmp_path / "peak" / "matmul_flops.json"
    entries = json.loads(cache.read_text())
    assert list(entries.values()) == [first]
    (key,) = entries
    cache.write_text(json.dumps({key: 123.0}))  # a later run reads it: no new measurement
    assert measured_peak_flops(shape, threads=1) == 123.0
    cache.write_text("{not json")  # a damaged cache costs one measurement, then is rewritten
    assert measured_peak_flops(shape, threads=1) > 1e6
    assert json.loads(cache.read_text())


def test_a_gpus_peak_is_declared_by_name():
    assert declared_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert declared_peak_flops("NVIDIA H200") == 989e12
    assert declared_peak_flops("Some Future Card") is None
