"""Token-balanced mini-batch layout: every row once, the same mini-batches, even ranks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlcore.protocol import DataProto  # noqa: E402
from rlcore.trainer.layout import (  # noqa: E402
    balanced_shares,
    mini_batch_layout,
    prompt_groups,
)


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
    sizes = out.meta_info["mini_batch_rows"]  # rows per rank of each mini-batch
    assert sizes == plain.meta_info["mini_batch_rows"]
    for m in range(len(sizes)):

        def rows_of(layout, m=m):
            picked = []
            for r in range(world):
                start = r * sum(sizes) + sum(sizes[:m])
                part = layout.batch["row"][start : start + sizes[m]]
                mask = layout.batch["response_mask"][start : start + sizes[m]].sum(-1) > 0
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


def grouped_batch(prompt_of: list[int], lengths: list[int], prompt: int = 6) -> DataProto:
    """Rows whose first ``prompt`` columns are prompt ``prompt_of[i]``; valid lengths vary."""
    width = prompt + 10
    ids = torch.arange(width).repeat(len(prompt_of), 1) + 100
    ids[:, :prompt] = torch.tensor(prompt_of).unsqueeze(1)
    attn = torch.zeros(len(prompt_of), width, dtype=torch.long)
    attn[:, :prompt] = 1
    for i, n in enumerate(lengths):
        attn[i, prompt : prompt + n] = 1
    return DataProto.from_dict(
        tensors={
            "row": torch.arange(len(prompt_of)),
            "input_ids": ids,
            "attention_mask": attn,
            "responses": ids[:, prompt:],
            "response_mask": attn[:, prompt:].clone(),
        }
    )


def test_prompt_groups_are_runs_of_equal_prompts():
    batch = grouped_batch([0, 0, 0, 1, 1, 0, 2, 2], [1] * 8)
    assert prompt_groups(batch) == [0, 0, 0, 1, 1, 2, 3, 3]  # row 5 repeats prompt 0 later
    assert prompt_groups(batch_with_lengths([3, 4])) is None  # no prompt/response columns


def test_balanced_layout_keeps_each_prompts_samples_together():
    """8 prompts x 4 samples over 2 ranks: each group whole on one rank, in order; tokens even."""
    g = torch.Generator().manual_seed(0)
    prompt_of = [p for p in range(8) for _ in range(4)]
    lengths = torch.randint(1, 11, (32,), generator=g).tolist()
    out = mini_batch_layout(
        grouped_batch(prompt_of, lengths), rows_per_mini_batch=32, world_size=2, balance_tokens=True
    )
    rows = out.batch["row"].tolist()
    assert sorted(rows) == list(range(32))
    halves = [rows[:16], rows[16:]]
    for half in halves:
        groups = [prompt_of[r] for r in half]
        for p in set(groups):
            members = [r for r in half if prompt_of[r] == p]
            assert len(members) == 4  # the whole group on this rank
            at = [half.index(r) for r in members]
            assert at == list(range(at[0], at[0] + 4))  # adjacent
            assert members == sorted(members)  # in their original order
    tokens = [sum(6 + lengths[r] for r in half) for half in halves]
    assert abs(tokens[0] - tokens[1]) <= 10 + 6  # within one row of each other
    # The engine sees one group per prompt: adjacent rows of a rank share their prompt.
    assert prompt_groups(out.slice(0, 16)) == [i // 4 for i in range(16)]


def test_a_group_larger_than_a_share_is_split():
    prompt_of = [0] * 6 + [1] * 2
    shares = balanced_shares(list(range(8)), [5] * 8, 2, groups=prompt_of)
    assert [len(s) for s in shares] == [4, 4]
    assert sorted(shares[0] + shares[1]) == list(range(8))
    # Group 0 fills one share and spills two rows into the other, next to group 1.
    assert {tuple(s) for s in shares} == {(0, 1, 2, 3), (4, 5, 6, 7)}


def test_skipped_rows_weigh_nothing_so_ranks_get_the_same_rows_to_train():
    """GRPO with the zero-advantage skip: the update drops whole tied groups, so the layout
    balances the rows each rank will train, not the rows it holds."""
    prompt_of = [p for p in range(4) for _ in range(4)]
    # Group tokens 64, 52, 40, 28; groups 0 and 3 tied (advantage 0: skipped). Balanced on
    # all tokens, one rank holds 0 and 3 (92 tokens) and the other 1 and 2 (92): all the
    # training lands on one rank.
    batch = grouped_batch(prompt_of, [10] * 4 + [7] * 4 + [4] * 4 + [1] * 4)
    trained_group = torch.tensor([p in (1, 2) for p in prompt_of])
    batch.batch["advantages"] = torch.where(trained_group, 1.0, 0.0).unsqueeze(1).expand(16, 10)

    def trained_per_rank(**kwargs):
        out = mini_batch_layout(batch, rows_per_mini_batch=16, world_size=2, **kwargs)
        rows = out.batch["row"]
        assert sorted(rows.tolist()) == list(range(16))
        return sorted([int(trained_group[rows[:8]].sum()), int(trained_group[rows[8:]].sum())])

    assert trained_per_rank(balance_tokens=True) == [0, 8]
    assert trained_per_rank(balance_tokens=True, skips_zero_advantage_rows=True) == [4, 4]
