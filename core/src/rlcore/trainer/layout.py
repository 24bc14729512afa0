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

__all__ = ["mini_batch_layout"]


def mini_batch_layout(batch: DataProto, *, rows_per_mini_batch: int, world_size: int) -> DataProto:
    """``batch`` (tensors only) reordered and padded as described in the module docstring."""
    rows = len(batch)
    per = max(1, min(rows_per_mini_batch, rows))
    minis = math.ceil(rows / per)
    share = math.ceil(per / world_size)  # rows per rank per mini-batch
    index: list[int] = []
    for rank in range(world_size):
        for m in range(minis):
            real = list(range(m * per, min((m + 1) * per, rows)))
            padded = real + [-1] * (share * world_size - len(real))
            index += padded[rank * share : (rank + 1) * share]
    order = np.asarray(index)
    if (order >= 0).all():
        return batch.select_idxs(order)
    out = batch.select_idxs(np.where(order >= 0, order, 0))
    pad = np.flatnonzero(order < 0)
    out.batch["response_mask"][pad] = 0
    return out
