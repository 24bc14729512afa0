"""Micro-batches of a mini-batch: how rows split (by count or token budget), where one
prompt's samples start, how many micro-batches every rank runs, and the totals every loss
divides by (:class:`~rlcore.interfaces.BatchTotals`, summed over ranks).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from rlcore.errors import ConfigError
from rlcore.interfaces import (
    BatchTotals,
)

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from rlcore.protocol import DataProto

__all__ = [
    "batch_totals",
    "micro_batch_count",
    "prompt_group_starts",
    "split_micro_batches",
    "whole_groups",
]


def prompt_group_starts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """(b,) bool: True where a row's prompt differs from the previous row's.

    The prompt is the columns before the last ``response_length``; two prompts are the same
    when the same columns are valid and hold the same tokens (at the same ``position_ids``,
    where given), so a copy computed for one row is exactly what the other would compute.
    The driver lays out each prompt's ``n`` samples next to each other: each run is a group.
    """
    import torch

    p = input_ids.shape[1] - response_length
    starts = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    if input_ids.shape[0] < 2 or p < 1:
        return starts
    valid = attention_mask[:, :p].bool()
    later = valid[1:]
    same = (valid[1:] == valid[:-1]).all(dim=1)
    same &= ((input_ids[1:, :p] == input_ids[:-1, :p]) | ~later).all(dim=1)
    if position_ids is not None and position_ids.dim() == 2:
        pos = position_ids[:, :p]
        same &= ((pos[1:] == pos[:-1]) | ~later).all(dim=1)
    starts[1:] = ~same
    return starts


def split_micro_batches(
    data: DataProto,
    *,
    micro_batch_size: int | None,
    max_tokens: int | None,
    packed: bool = False,
    share_prompts: bool = False,
) -> list[DataProto]:
    """Split ``data`` into contiguous micro-batches, keeping row order.

    By count: ``micro_batch_size`` rows each (the last may be shorter). By token budget
    (dynamic batching, ``max_tokens`` set): rows are packed greedily, in order, while the
    micro-batch's padded size ``rows * max(valid tokens of its rows)`` stays within
    ``max_tokens`` (``packed``: the sum of its rows' valid tokens, for an engine that runs a
    micro-batch padding-free; with ``share_prompts`` a row whose prompt the row before in the
    same micro-batch shares counts its response only, as the engine runs that prompt once);
    a single row longer than the budget gets a micro-batch of its own. Contiguous packing
    keeps the order, so outputs concatenate back without a permutation.

    With a ``group_index`` tensor (the driver's layout writes it when a step asks that rows of
    one group stay together, :func:`rlcore.trainer.layout.mini_batch_layout`) no micro-batch
    boundary falls inside a group: a cut moves to the group's start (or, for a group that
    begins the micro-batch, to its end), so a micro-batch may exceed its size or budget by
    part of a group. Every rank may then run a different number of micro-batches; the loop's
    ``match_ranks`` evens that out (:func:`rlcore.engine.accumulate_gradients`).
    """
    n = len(data)
    if n == 0:
        return []
    parts = _split_bounds(
        data,
        micro_batch_size=micro_batch_size,
        max_tokens=max_tokens,
        packed=packed,
        share_prompts=share_prompts,
    )
    if "group_index" in data.batch:
        parts = whole_groups(parts, data.batch["group_index"].tolist())
    return [data.slice(a, b) for a, b in parts]


def whole_groups(bounds: list[tuple[int, int]], groups: list[int]) -> list[tuple[int, int]]:
    """``bounds`` (contiguous ``[start, end)`` parts of ``len(groups)`` rows) with no part
    boundary inside a run of equal ``groups`` values."""
    n = len(groups)
    edges = [0]
    for _, end in bounds[:-1]:
        cut = end
        while 0 < cut < n and groups[cut] == groups[cut - 1]:
            cut -= 1  # back to the group's start
        if cut <= edges[-1]:  # the group starts this part: it ends it instead
            cut = end
            while cut < n and groups[cut] == groups[cut - 1]:
                cut += 1
        if edges[-1] < cut < n:
            edges.append(cut)
    edges.append(n)
    return list(itertools.pairwise(edges))


def _split_bounds(
    data: DataProto,
    *,
    micro_batch_size: int | None,
    max_tokens: int | None,
    packed: bool,
    share_prompts: bool,
) -> list[tuple[int, int]]:
    """The ``[start, end)`` rows of each micro-batch (see :func:`split_micro_batches`)."""
    n = len(data)
    if max_tokens is not None:
        if max_tokens < 1:
            msg = f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}"
            raise ConfigError(msg)
        mask = data.batch["attention_mask"]
        lengths = mask.sum(dim=-1).tolist()  # (B,) valid tokens per row
        # Tokens a row adds after a row with the same prompt (shared: its response only).
        following = lengths
        shares = (
            packed and share_prompts and "responses" in data.batch and "input_ids" in data.batch
        )
        if shares:
            r = data.batch["responses"].shape[1]
            continues = (~prompt_group_starts(data.batch["input_ids"], mask, r)).tolist()
            response_tokens = mask[:, mask.shape[1] - r :].sum(dim=-1).tolist()
            following = [
                resp if c else full
                for resp, c, full in zip(response_tokens, continues, lengths, strict=True)
            ]
        bounds, start, longest, total = [], 0, 0, 0
        for i, length in enumerate(lengths):
            added = int(following[i]) if i > start else int(length)
            longest_with, total_with = max(longest, int(length)), total + added
            size = total_with if packed else (i - start + 1) * longest_with
            if i > start and size > max_tokens:
                bounds.append((start, i))
                start, longest_with, total_with = i, int(length), int(length)
            longest, total = longest_with, total_with
        bounds.append((start, n))
        return bounds
    if micro_batch_size is None or micro_batch_size < 1:
        msg = (
            "set exactly one of micro_batch_size (>= 1) or max_tokens_per_micro_batch "
            f"for the engine; got micro_batch_size={micro_batch_size}"
        )
        raise ConfigError(msg)
    count = math.ceil(n / micro_batch_size)
    return [(i * micro_batch_size, min(n, (i + 1) * micro_batch_size)) for i in range(count)]


def micro_batch_count(local: int, device: torch.device | None = None) -> int:
    """The largest number of micro-batches over ranks (1 rank, or no process group: ``local``).

    Ranks with fewer micro-batches (token budgets differ per rank) run zero-weight passes
    up to this count, so every rank issues the same collectives (FSDP all-gathers).
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    count = torch.tensor([local], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def batch_totals(
    batch: DataProto,
    device: torch.device | None = None,
    group: dist.ProcessGroup | None = None,
) -> BatchTotals:
    """:class:`BatchTotals` of this rank's share of a mini-batch, summed over all ranks.

    ``tokens``: valid response tokens; ``sequences``: rows with at least one valid token
    (the driver's padding rows have none); ``max_response_length``: the largest R. Collective
    when a process group of more than one rank exists: every rank must call it. ``group``:
    sum over this group only (an engine whose tensor/pipeline-parallel ranks share rows sums
    over its data-parallel group); None: the default group.
    """
    import torch
    import torch.distributed as dist

    mask = batch.batch["response_mask"]
    per_row = mask.sum(-1)
    sums = torch.tensor(
        [int(per_row.sum().item()), int((per_row > 0).sum().item())],
        dtype=torch.int64,
        device=device,
    )
    longest = torch.tensor([mask.shape[1]], dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(sums, group=group)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    return BatchTotals(
        tokens=int(sums[0]), sequences=int(sums[1]), max_response_length=int(longest[0])
    )
