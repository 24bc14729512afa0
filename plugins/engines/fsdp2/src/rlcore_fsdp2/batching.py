"""Micro-batches of a mini-batch: by row count or by a token budget, order kept.

Pure functions over :class:`~rlcore.protocol.DataProto` (no process group), so they are unit
tested directly. The engine equalises the number of micro-batches across ranks itself.
"""

from __future__ import annotations

import math

import torch

from rlcore.errors import ConfigError
from rlcore.protocol import DataProto


def split_micro_batches(
    data: DataProto, *, micro_batch_size: int | None, max_tokens: int | None
) -> list[DataProto]:
    """Split ``data`` into contiguous micro-batches, keeping row order.

    By count: ``micro_batch_size`` rows each (the last may be shorter). By token budget
    (dynamic batching): rows are packed greedily, in order, while the micro-batch's padded size
    ``rows * max(valid tokens of its rows)`` stays within ``max_tokens``; a single row longer
    than the budget gets a micro-batch of its own. Contiguous packing keeps the order, so
    outputs concatenate back without a permutation.
    """
    n = len(data)
    if n == 0:
        return []
    if max_tokens is not None:
        if max_tokens < 1:
            msg = f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}"
            raise ConfigError(msg)
        lengths = data.batch["attention_mask"].sum(dim=-1).tolist()  # (B,) valid tokens per row
        bounds, start, longest = [], 0, 0
        for i, length in enumerate(lengths):
            longest_with = max(longest, int(length))
            if i > start and (i - start + 1) * longest_with > max_tokens:
                bounds.append((start, i))
                start, longest_with = i, int(length)
            longest = longest_with
        bounds.append((start, n))
        return [data.slice(a, b) for a, b in bounds]
    if micro_batch_size is None or micro_batch_size < 1:
        msg = (
            "set exactly one of micro_batch_size (>= 1) or max_tokens_per_micro_batch "
            f"for the engine; got micro_batch_size={micro_batch_size}"
        )
        raise ConfigError(msg)
    count = math.ceil(n / micro_batch_size)
    return [
        data.slice(i * micro_batch_size, min(n, (i + 1) * micro_batch_size)) for i in range(count)
    ]


def trim_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop leading columns that are padding in every row of a (left-padded) micro-batch.

    Exact, because positions are explicit: a row's tokens keep their ``position_ids`` and
    attend to the same keys. Saves compute when a micro-batch's prompts are all short.
    """
    valid_cols = attention_mask.bool().any(dim=0)  # (T,)
    first = int(valid_cols.float().argmax()) if bool(valid_cols.any()) else 0
    if first == 0:
        return input_ids, attention_mask, position_ids
    return input_ids[:, first:], attention_mask[:, first:], position_ids[:, first:]
