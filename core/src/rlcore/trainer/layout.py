"""Row layout for the update passes: whole mini-batches per rank, padded with zero-weight rows.

The driver expands prompts to rows once (``n`` per prompt). For an update, mini-batch ``m``
is rows ``[m*S, (m+1)*S)`` of the step's batch (``S`` = mini-batch prompts × ``n``; the last
may be shorter). Each mini-batch is padded to a multiple of the world size ``W`` with rows whose
``response_mask`` is all zero (they carry no tokens, so every loss ignores them and
:func:`rlcore.engine_utils.batch_totals` does not count them), then the rows are ordered
rank-major: rank ``r`` gets its share of mini-batch 0, then of mini-batch 1, ... Dispatch
then splits the batch into ``W`` equal contiguous chunks (no padding of its own, which would
duplicate real rows), and each rank cuts its chunk into ``mini_batches`` equal parts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = ["balanced_shares", "mini_batch_layout"]


def balanced_shares(rows: list[int], lengths: list[int], world_size: int) -> list[list[int]]:
    """``rows`` split into ``world_size`` shares of equal size with near-equal token sums.

    Greedy longest-first: each row, longest first, goes to the share with the fewest tokens
    that still has room (``len(rows) / world_size`` rows each; the caller pads to a multiple).
    A share's rows are ordered by length, so a token-budget split wastes little padding.
    ``lengths[i]`` is the token count of ``rows[i]``; a padding row (-1) counts as 0.
    """
    size = len(rows) // world_size
    shares: list[list[int]] = [[] for _ in range(world_size)]
    sums = [0] * world_size
    for i in sorted(range(len(rows)), key=lambda i: (-lengths[i], i)):
        open_ = [r for r in range(world_size) if len(shares[r]) < size]
        target = min(open_, key=lambda r: (sums[r], r))
        shares[target].append(i)
        sums[target] += lengths[i]
    return [[rows[i] for i in sorted(share, key=lambda i: (lengths[i], i))] for share in shares]


def mini_batch_layout(
    batch: DataProto, *, rows_per_mini_batch: int, world_size: int, balance_tokens: bool = False
) -> DataProto:
    """``batch`` (tensors only) reordered and padded as described in the module docstring.

    ``balance_tokens``: within each mini-batch, give every rank about the same number of
    tokens (:func:`balanced_shares`) instead of contiguous rows: a mini-batch's rows, and so
    its gradient, are the same; the slowest rank, which every rank waits for, is faster.
    """
    rows = len(batch)
    per = max(1, min(rows_per_mini_batch, rows))
    minis = math.ceil(rows / per)
    share = math.ceil(per / world_size)  # rows per rank per mini-batch
    lengths = batch.batch["attention_mask"].sum(-1).tolist() if balance_tokens else []
    shares: list[list[list[int]]] = []  # [mini-batch][rank] -> rows
    for m in range(minis):
        real = list(range(m * per, min((m + 1) * per, rows)))
        padded = real + [-1] * (share * world_size - len(real))
        if balance_tokens and world_size > 1:
            tokens = [int(lengths[i]) if i >= 0 else 0 for i in padded]
            shares.append(balanced_shares(padded, tokens, world_size))
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
