"""The driver's update layout: whole mini-batches per rank, zero-weight padding rows."""

from __future__ import annotations

import pytest
import torch

from rlcore.protocol import DataProto
from rlcore.trainer.layout import mini_batch_layout


def _rows(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={
            "row": torch.arange(n),
            "response_mask": torch.ones(n, 3, dtype=torch.long),
        }
    )


@pytest.mark.parametrize(
    ("rows", "per_mini", "world"), [(21, 21, 2), (21, 21, 3), (40, 40, 2), (12, 6, 4), (10, 4, 3)]
)
def test_each_rank_gets_equal_whole_mini_batches(rows, per_mini, world):
    out = mini_batch_layout(_rows(rows), rows_per_mini_batch=per_mini, world_size=world)
    minis = -(-rows // per_mini)
    share = -(-per_mini // world)
    assert len(out) == world * minis * share  # dispatch splits it evenly: no padding there
    mask = out.batch["response_mask"]
    real = mask.sum(-1) > 0
    # Every real row appears exactly once; padding rows carry no tokens.
    assert sorted(out.batch["row"][real].tolist()) == list(range(rows))
    assert int((~real).sum()) == len(out) - rows
    # Rank r's chunk, cut into `minis` equal parts, holds only rows of mini-batch m in part m.
    chunks = out.chunk(world)
    for chunk in chunks:
        for m, part in enumerate(chunk.chunk(minis)):
            got = part.batch["row"][part.batch["response_mask"].sum(-1) > 0]
            assert all(m * per_mini <= int(r) < (m + 1) * per_mini for r in got)


def test_the_original_batch_is_untouched():
    batch = _rows(5)
    mini_batch_layout(batch, rows_per_mini_batch=5, world_size=2)
    assert int(batch.batch["response_mask"].sum()) == 15
