"""Batch metrics with verl's names, timers and throughput."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rlcore.protocol import DataProto
from rlcore.tracking.metrics import (
    Timer,
    compute_data_metrics,
    compute_throughput_metrics,
    peak_rss_gb,
    timed,
    timing_metrics,
)


def make_batch(with_values: bool = False) -> DataProto:
    # 3 sequences, prompt width 4, response width 3
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    scores = torch.zeros(3, 3)
    scores[0, 1], scores[1, 2], scores[2, 0] = 1.0, 0.0, 0.5
    adv = torch.tensor([[1.0, 1.0, 9.0], [-1.0, -1.0, -1.0], [0.5, 9.0, 9.0]])
    tensors = {
        "responses": torch.zeros(3, 3, dtype=torch.long),
        "response_mask": response_mask,
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "token_level_scores": scores,
        "token_level_rewards": scores - 0.1 * response_mask,
        "advantages": adv,
    }
    if with_values:
        tensors["returns"] = adv.clone()
        tensors["values"] = adv * 0.5
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(["a", "b", "c"])})


def test_data_metrics_follow_verl_names_and_mask_padding():
    m = compute_data_metrics(make_batch())
    assert m["critic/score/mean"] == pytest.approx(0.5)
    assert m["critic/score/max"] == 1.0
    assert m["critic/score/min"] == 0.0
    # rewards: score minus 0.1 per response token (2, 3, 1 tokens)
    assert m["critic/rewards/mean"] == pytest.approx((0.8 - 0.3 + 0.4) / 3)
    # the 9.0s sit on padding and must not count
    assert m["critic/advantages/max"] == 1.0
    assert m["critic/advantages/mean"] == pytest.approx((1 + 1 - 3 + 0.5) / 6)
    assert m["response_length/mean"] == pytest.approx(2.0)
    assert m["response_length/max"] == 3.0
    assert m["response_length/min"] == 1.0
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["prompt_length/mean"] == pytest.approx(3.0)
    assert "critic/values/mean" not in m
    assert "critic/returns/mean" not in m


def test_data_metrics_with_a_critic():
    m = compute_data_metrics(make_batch(with_values=True))
    assert m["critic/returns/mean"] == pytest.approx(m["critic/advantages/mean"])
    assert m["critic/values/mean"] == pytest.approx(m["critic/advantages/mean"] / 2)
    assert 0.0 < m["critic/vf_explained_var"] < 1.0


def test_prompt_only_batches_report_prompt_length():
    batch = DataProto.from_dict(tensors={"attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])})
    assert compute_data_metrics(batch) == {
        "prompt_length/mean": 2.5,
        "prompt_length/max": 3.0,
        "prompt_length/min": 2.0,
    }


def test_timed_accumulates_and_survives_errors():
    timing: dict[str, float] = {}
    with timed("gen", timing) as t:
        time.sleep(0.02)
    assert t.elapsed >= 0.02
    assert timing["gen"] == pytest.approx(t.elapsed)

    def fail():
        with timed("gen", timing):
            time.sleep(0.01)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert timing["gen"] >= 0.03
    assert timing_metrics({"gen": 1.5, "step": 2}) == {"timing_s/gen": 1.5, "timing_s/step": 2.0}
    with Timer() as timer:
        pass
    assert timer.elapsed >= 0.0


def test_throughput_counts_real_tokens():
    batch = make_batch()
    m = compute_throughput_metrics(batch, {"step": 2.0, "gen": 0.5}, n_workers=2)
    total = 3 + 4 + 2 + 6  # prompt + response tokens, padding excluded
    assert m["perf/total_num_tokens"] == total
    assert m["perf/tokens_per_s"] == pytest.approx(total / 2.0)
    assert m["perf/throughput"] == pytest.approx(total / 4.0)
    assert m["perf/gen_tokens_per_s"] == pytest.approx(6 / 0.5)
    assert m["perf/time_per_step"] == 2.0
    assert "perf/tokens_per_s" not in compute_throughput_metrics(batch, {})


def test_peak_rss_is_the_processes_high_water_mark_maxed_over_ranks():
    from pathlib import Path

    from rlcore.tracking.reductions import reduce_metrics

    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("no /proc (not Linux)")
    (line,) = [x for x in status.read_text().splitlines() if x.startswith("VmRSS:")]
    now_gb = int(line.split()[1]) / (1 << 20)  # kB
    assert now_gb * 0.99 <= peak_rss_gb() < 1024
    # Per role the largest process counts, not the mean of the ranks.
    assert reduce_metrics({"perf/peak_rss_gb/actor": [1.5, 2.5]}) == {"perf/peak_rss_gb/actor": 2.5}
