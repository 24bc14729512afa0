"""Input trimming for a micro-batch (micro-batching itself is :mod:`rlcore.engine`)."""

from __future__ import annotations

import torch


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
