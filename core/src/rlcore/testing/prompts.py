"""Rollout inputs from text: prompt rows laid out as the driver hands them to a rollout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.engine.rollout_layout import position_ids_from_mask
from rlcore.protocol import DataProto

__all__ = ["prompt_batch"]


def prompt_batch(tokenizer: Any, texts: Sequence[str]) -> DataProto:
    """``texts`` tokenized and left-padded: ``input_ids``, ``attention_mask``, ``position_ids``.

    Positions count valid tokens from 0 (what the driver's data loader produces), so a
    padded row sees the positions it would see alone.
    """
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": position_ids_from_mask(mask),
        }
    )
