"""Token-balanced mini-batch layout: every row once, the same mini-batches, even ranks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlcore.protocol import DataProto  # noqa: E402
from rlcore.trainer.layout import balanced_shares, mini_batch_layout  # noqa: E402


def batch_with_lengths(lengths: list[int], width: int = 40) -> DataProto:
    attn = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, width - n :] = 1
    return DataProto.from_dict(
        tensors={
            "row": torch.arange(len(lengths)),
            "attention_mask": attn,
            "response_mask": torch.ones(len(lengths), 4, dtype=torch.long),
        }
    )


@pytest.mark.parametrize(("rows", "per", "world"), [(16, 8, 2), (12, 12, 4), (10, 6, 4)])
def test_balanced_layout_uses_every_row_once_in_its_mini_batch(rows, per, world):
    g = torch.Generator().manual_seed(rows)
    lengths = torch.randint(1, 40, (rows,), generator=g).tolist()
    out = mini_batch_layout(
        batch_with_lengths(lengths), rows_per_mini_batch=per, world_size=world, balance_tokens=True
    )
    plain = mini_batch_layout(
        batch_with_lengths(lengths), rows_per_mini_batch=per, world_size=world
    )
    assert len(out) == len(plain)
    real = out.batch["response_mask"].sum(-1) > 0
    used = out.batch["row"][real].tolist()
    assert sorted(used) == list(range(rows))  # every row exactly once
    # Rank r's chunk holds its share of each mini-batch, in order: same sets as contiguous.
    minis = -(-rows // per)
    share = len(out) // (world * minis)
    for m in range(minis):

        def rows_of(layout, m=m):
            picked = []
            for r in range(world):
                start = (r * minis + m) * share
                part = layout.batch["row"][start : start + share]
                mask = layout.batch["response_mask"][start : start + share].sum(-1) > 0
                picked += part[mask].tolist()
            return sorted(picked)

        assert rows_of(out) == rows_of(plain)


def test_balanced_shares_even_out_tokens():
    lengths = [30, 29, 28, 27, 3, 2, 2, 1]
    shares = balanced_shares(list(range(8)), lengths, 2)
    assert [len(s) for s in shares] == [4, 4]
    sums = [sum(lengths[i] for i in s) for s in shares]
    assert abs(sums[0] - sums[1]) <= 3  # contiguous halves: 114 vs 8
    assert sorted(shares[0] + shares[1]) == list(range(8))
