"""Row layout for the update passes: whole mini-batches per rank, padded with zero-weight rows.

The driver expands prompts to rows once (``n`` per prompt). For an update, mini-batch ``m``
is rows ``[m*S, (m+1)*S)`` of the step's batch (``S`` = mini-batch prompts × ``n``; the last
may be shorter). Each mini-batch is padded to a multiple of the world size ``W`` with rows whose
``response_mask`` is all zero (they carry no tokens, so every loss ignores them and
:func:`rlcore.engine.batch_totals` does not count them), then the rows are ordered
rank-major: rank ``r`` gets its share of mini-batch 0, then of mini-batch 1, ... Dispatch
then splits the batch into ``W`` equal contiguous chunks (no padding of its own, which would
duplicate real rows), and each rank cuts its chunk into ``mini_batches`` equal parts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rlcore.engine import prompt_group_starts
from rlcore.roles.levers import trained_rows

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = ["balanced_shares", "mini_batch_layout", "prompt_groups"]


def balanced_shares(
    rows: list[int], lengths: list[int], world_size: int, groups: list[int] | None = None
) -> list[list[int]]:
    """``rows`` split into ``world_size`` shares of equal size with near-equal token sums.

    Greedy longest-first: each unit, heaviest first, goes to the share with the fewest tokens
    that still has room (``len(rows) / world_size`` rows each; the caller pads to a multiple).
    A unit is one row, or with ``groups`` a run of rows with the same group id (the samples
    of one prompt): kept on one rank, in order, so the engine can pack their shared prompt
    once; a unit larger than any share's room is split over shares. A share's units are
    ordered by mean row length, so a token-budget split wastes little padding.
    ``lengths[i]`` is the token count of ``rows[i]``; a padding row (-1) counts as 0 and is a
    unit of its own.
    """
    size = len(rows) // world_size
    units: list[list[int]] = []
    for i in range(len(rows)):
        real_pair = i > 0 and rows[i] >= 0 and rows[i - 1] >= 0
        if groups is not None and real_pair and groups[i] == groups[i - 1]:
            units[-1].append(i)
        else:
            units.append([i])
    shares: list[list[list[int]]] = [[] for _ in range(world_size)]
    room = [size] * world_size
    sums = [0] * world_size
    weight = [sum(lengths[i] for i in unit) for unit in units]
    for u in sorted(range(len(units)), key=lambda u: (-weight[u], units[u][0])):
        pending = units[u]
        while pending:
            fits = [r for r in range(world_size) if room[r] >= len(pending)]
            open_ = fits or [r for r in range(world_size) if room[r] > 0]
            target = min(open_, key=lambda r: (sums[r], r))
            part, pending = pending[: room[target]], pending[room[target] :]
            shares[target].append(part)
            room[target] -= len(part)
            sums[target] += sum(lengths[i] for i in part)

    def mean_length(part: list[int]) -> tuple[float, int]:
        return (sum(lengths[i] for i in part) / len(part), part[0])

    return [[rows[i] for part in sorted(share, key=mean_length) for i in part] for share in shares]


def prompt_groups(batch: DataProto) -> list[int] | None:
    """Per row, an id shared by adjacent rows with the same prompt; None without the keys.

    The test is :func:`rlcore.engine.prompt_group_starts`, which the FSDP2 engine's
    shared-prompt packing uses too.
    """
    keys = ("input_ids", "attention_mask", "responses")
    if any(k not in batch.batch for k in keys):
        return None
    b = batch.batch
    starts = prompt_group_starts(b["input_ids"], b["attention_mask"], b["responses"].shape[1])
    return (starts.long().cumsum(0) - 1).tolist()


def mini_batch_layout(
    batch: DataProto,
    *,
    rows_per_mini_batch: int,
    world_size: int,
    balance_tokens: bool = False,
    skips_zero_advantage_rows: bool = False,
) -> DataProto:
    """``batch`` (tensors only) reordered and padded as described in the module docstring.

    ``balance_tokens``: within each mini-batch, give every rank about the same number of
    tokens (:func:`balanced_shares`) instead of contiguous rows: a mini-batch's rows, and so
    its gradient, are the same; the slowest rank, which every rank waits for, is faster. The
    samples of one prompt (:func:`prompt_groups`) stay together on a rank where they fit.
    ``skips_zero_advantage_rows``: the update leaves zero-advantage rows out of its backward
    (:func:`rlcore.roles.levers.drop_zero_advantage_rows`), so their tokens cost a rank
    nothing and count 0 here: ranks get about the same tokens to train, not to hold.
    """
    rows = len(batch)
    per = max(1, min(rows_per_mini_batch, rows))
    minis = math.ceil(rows / per)
    share = math.ceil(per / world_size)  # rows per rank per mini-batch
    lengths: list[int] = []
    if balance_tokens:
        counts = batch.batch["attention_mask"].sum(-1)
        if skips_zero_advantage_rows and "advantages" in batch.batch:
            counts = counts * trained_rows(batch)  # a dropped row costs its rank nothing
        lengths = counts.tolist()
    groups = prompt_groups(batch) if balance_tokens and world_size > 1 else None
    shares: list[list[list[int]]] = []  # [mini-batch][rank] -> rows
    for m in range(minis):
        real = list(range(m * per, min((m + 1) * per, rows)))
        padded = real + [-1] * (share * world_size - len(real))
        if balance_tokens and world_size > 1:
            tokens = [int(lengths[i]) if i >= 0 else 0 for i in padded]
            unit_of = None if groups is None else [groups[i] if i >= 0 else -1 for i in padded]
            shares.append(balanced_shares(padded, tokens, world_size, unit_of))
        else:
            shares.append([padded[r * share : (r + 1) * share] for r in range(world_size)])
    index: list[int] = []
    for rank in range(world_size):
        for m in range(minis):
            index += shares[m][rank]
    order = np.asarray(index)
    if (order >= 0).all():
        return batch.select_idxs(order)
    out = batch.select_idxs(np.where(order >= 0, order, 0))
    pad = np.flatnonzero(order < 0)
    out.batch["response_mask"][pad] = 0
    return out
