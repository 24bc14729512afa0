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
    sizes = out.meta_info["mini_batch_rows"]  # rows per rank of each mini-batch
    assert len(sizes) == minis
    assert len(out) == world * sum(sizes)  # dispatch splits it evenly: no padding there
    mask = out.batch["response_mask"]
    real = mask.sum(-1) > 0
    # Every real row appears exactly once; padding rows carry no tokens, fewer than `world`
    # per mini-batch (a short last mini-batch is not padded to a full one).
    assert sorted(out.batch["row"][real].tolist()) == list(range(rows))
    assert int((~real).sum()) == len(out) - rows
    assert len(out) - rows < world * minis
    # Rank r's chunk, cut into the layout's sizes, holds only rows of mini-batch m in part m.
    for chunk in out.chunk(world):
        start = 0
        for m, size in enumerate(sizes):
            part = chunk.slice(start, start + size)
            start += size
            got = part.batch["row"][part.batch["response_mask"].sum(-1) > 0]
            assert all(m * per_mini <= int(r) < (m + 1) * per_mini for r in got)


def test_the_original_batch_is_untouched():
    batch = _rows(5)
    mini_batch_layout(batch, rows_per_mini_batch=5, world_size=2)
    assert int(batch.batch["response_mask"].sum()) == 15


def test_a_subset_of_rows_takes_the_configured_steps_without_padding():
    """A program that keeps 7 of 32 rows: 2 mini-batches (as configured) of 4 and 3 rows on
    one rank, no zero-weight row; on 2 ranks one padding row per odd mini-batch at most."""
    out = mini_batch_layout(_rows(7), rows_per_mini_batch=16, mini_batches=2, world_size=1)
    assert out.meta_info["mini_batch_rows"] == [4, 3]
    assert out.batch["row"].tolist() == list(range(7))
    assert bool((out.batch["response_mask"].sum(-1) > 0).all())
    two = mini_batch_layout(_rows(7), rows_per_mini_batch=16, mini_batches=2, world_size=2)
    assert two.meta_info["mini_batch_rows"] == [2, 2]
    assert int((two.batch["response_mask"].sum(-1) == 0).sum()) == 1
    # Fewer rows than mini-batches: one row each.
    one = mini_batch_layout(_rows(2), rows_per_mini_batch=16, mini_batches=4, world_size=1)
    assert one.meta_info["mini_batch_rows"] == [1, 1]


def test_kept_groups_stay_whole_on_a_rank_and_in_a_micro_batch():
    """Pairs (two rows per uid, handed over out of order) on 2 ranks, micro-batches of 1 row:
    each pair is adjacent on one rank and the engine's split keeps it in one micro-batch."""
    from rlcore.engine import split_micro_batches
    from rlcore.trainer.layout import group_index

    batch = _rows(10)
    uids = ["a", "b", "c", "a", "b", "c", "d", "d", "e", "e"]
    batch.non_tensor_batch["uid"] = __import__("numpy").array(uids, dtype=object)
    out = mini_batch_layout(
        batch.select(non_tensor_batch_keys=[]),
        rows_per_mini_batch=10,
        mini_batches=1,
        world_size=2,
        groups=group_index(batch),
    )
    assert out.meta_info["mini_batch_rows"] == [6]  # 3 pairs on one rank, 2 + padding
    groups = out.batch["group_index"].tolist()
    for rank in out.chunk(2):
        for micro in split_micro_batches(rank, micro_batch_size=1, max_tokens=None):
            rows = micro.batch["row"].tolist()
            real = micro.batch["response_mask"].sum(-1) > 0
            assert len({uids[r] for r, keep in zip(rows, real.tolist(), strict=True) if keep}) <= 1
            if bool(real.any()):
                assert len(micro) == 2  # the whole pair, never one row of it
    real_rows = [r for r, g in zip(out.batch["row"].tolist(), groups, strict=True) if g >= 0]
    assert sorted(real_rows) == list(range(10))
