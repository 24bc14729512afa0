"""The shared engine machinery: LR schedule formula, micro-batches, totals, non-finite skip."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from rlcore.engine import (
    batch_totals,
    clip_and_step,
    learning_rate,
    lr_multiplier,
    split_micro_batches,
)
from rlcore.interfaces import OptimConfig
from rlcore.protocol import DataProto


def test_lr_schedule_warmup_constant_cosine():
    kw = {"warmup_steps": 2, "total_steps": 6, "min_lr_ratio": 0.1}
    assert [lr_multiplier(s, schedule="constant", **kw) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
    cos = [lr_multiplier(s, schedule="cosine", **kw) for s in range(8)]
    assert cos[:3] == [0.5, 1.0, 1.0]
    # The documented formula: the minimum is reached at the last step, total_steps - 1.
    assert cos[4] > 0.1 + 1e-6
    assert cos[5] == pytest.approx(0.1)
    assert cos[7] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(cos[1:]))
    optim = OptimConfig(lr=2.0, schedule="cosine", min_lr_ratio=0.0)
    assert learning_rate(optim, 0, 5) == pytest.approx(2.0)
    assert learning_rate(optim, 2, 5) == pytest.approx(1.0)
    assert learning_rate(optim, 4, 5) == pytest.approx(0.0)


def _batch(masks: list[list[int]]) -> DataProto:
    mask = torch.tensor(masks)
    rows = mask.shape[0]
    attn = torch.cat([torch.ones(rows, 2, dtype=torch.long), mask], 1)
    return DataProto.from_dict(tensors={"response_mask": mask, "attention_mask": attn})


def test_batch_totals_skip_padding_rows():
    totals = batch_totals(_batch([[1, 1, 0], [0, 0, 0], [1, 1, 1]]))
    assert (totals.tokens, totals.sequences, totals.max_response_length) == (5, 2, 3)


def test_micro_batches_by_count_and_budget():
    data = _batch([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    assert [len(m) for m in split_micro_batches(data, micro_batch_size=2, max_tokens=None)] == [
        2,
        2,
        1,
    ]
    by_budget = split_micro_batches(data, micro_batch_size=None, max_tokens=10)
    assert sum(len(m) for m in by_budget) == 5
    for mb in by_budget:
        assert len(mb) == 1 or len(mb) * int(mb.batch["attention_mask"].sum(-1).max()) <= 10


def test_clip_and_step_skips_non_finite_and_applies_lr():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=123.0)
    p.grad = torch.tensor([1.0, 0.0, 0.0])
    norm = clip_and_step(opt, [p], lr=0.5, max_norm=0.0)
    assert norm == pytest.approx(1.0)
    assert p.detach().tolist() == [0.5, 1.0, 1.0]  # the lr given, not the optimizer's own
    p.grad = torch.tensor([float("nan"), 0.0, 0.0])
    assert math.isnan(clip_and_step(opt, [p], lr=0.5, max_norm=1.0))
    assert p.detach().tolist() == [0.5, 1.0, 1.0]
    assert p.grad is None
