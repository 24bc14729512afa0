"""A dataloader over a PromptDataset whose position can be saved and restored.

Each ``iter(loader)`` walks one epoch (the rest of it, after a resume) in a permutation drawn
from ``numpy.random.default_rng(seed + epoch)``, so the order depends only on (seed, epoch)
and a resumed run yields exactly the batches the interrupted one had left. Batches are
DataProto objects shaped for the rollout:

    batch["input_ids"]        (B, P) int64, LEFT-padded to the longest prompt in the batch
    batch["attention_mask"]   (B, P) int64, 0 on padding
    batch["position_ids"]     (B, P) int64, cumsum(mask) - 1, clipped at 0 (position_ids_from_mask)
    non_tensor_batch          data_source, reward_model, extra_info, index, raw_prompt,
                              raw_prompt_ids (unpadded ids, for engines that take lists),
                              uid ("<name>-<epoch>-<row>": stable across resumes, unique per
                              prompt within an epoch, shared by its n samples after repeat)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from rlcore.data.dataset import PromptDataset
from rlcore.engine.rollout_layout import position_ids_from_mask
from rlcore.errors import DataError

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = ["PromptDataLoader", "collate_prompts"]


def collate_prompts(
    dataset: PromptDataset,
    rows: np.ndarray | list[int],
    uids: list[str],
    *,
    pad_to: int | None = None,
) -> DataProto:
    """A DataProto for dataset rows ``rows``, left-padded to the longest (or to ``pad_to``)."""
    import torch

    from rlcore.protocol import DataProto

    ids = [dataset.input_ids[int(r)] for r in rows]
    width = max(len(x) for x in ids) if pad_to is None else pad_to
    input_ids = torch.full((len(ids), width), dataset.pad_token_id, dtype=torch.long)  # (B, P)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)  # (B, P)
    for i, x in enumerate(ids):
        if x:  # left padding: the prompt ends at the last column, where generation continues
            input_ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            attention_mask[i, width - len(x) :] = 1
    position_ids = position_ids_from_mask(attention_mask)  # (B, P)

    def column(values: list[Any]) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values  # element-wise: keeps dicts and lists as single objects
        return out

    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        },
        non_tensors={
            "data_source": column([dataset.data_sources[int(r)] for r in rows]),
            "reward_model": column([dataset.reward_models[int(r)] for r in rows]),
            "extra_info": column([dataset.extra_infos[int(r)] for r in rows]),
            "index": column([dataset.indices[int(r)] for r in rows]),
            "raw_prompt": column([dataset.raw_prompts[int(r)] for r in rows]),
            "raw_prompt_ids": column([list(x) for x in ids]),
            "uid": column(list(uids)),
        },
    )


@attrs.define(eq=False, slots=False)
class PromptDataLoader:
    """Batches of prompts; ``state_dict()``/``load_state_dict()`` save and restore the position.

    ``len(loader)`` is the number of batches per epoch. ``drop_last`` drops a final partial
    batch (training wants equal batches); validation uses ``shuffle=False, drop_last=False``.
    ``pad_to_max_length`` pads every batch to ``dataset.max_prompt_length`` instead of the
    batch's longest prompt (fixed shapes, for engines that compile per shape).
    """

    dataset: PromptDataset
    batch_size: int
    shuffle: bool = attrs.field(default=True, kw_only=True)
    seed: int = attrs.field(default=0, kw_only=True)
    drop_last: bool = attrs.field(default=True, kw_only=True)
    pad_to_max_length: bool = attrs.field(default=False, kw_only=True)
    epoch: int = attrs.field(default=0, init=False)
    position: int = attrs.field(default=0, init=False)  # batches of this epoch handed out

    def __attrs_post_init__(self) -> None:
        dataset, batch_size = self.dataset, self.batch_size
        if batch_size <= 0:
            msg = f"batch_size must be > 0, got {batch_size}"
            raise DataError(msg)
        if self.drop_last and len(dataset) < batch_size:
            msg = (
                f"the {dataset.name} set has {len(dataset)} prompts, fewer than one batch of "
                f"{batch_size}; lower the batch size or add data"
            )
            raise DataError(msg)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The row order of ``epoch`` (a permutation when shuffling)."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng(self.seed + epoch).permutation(n)

    def _roll_over(self) -> None:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0

    def __iter__(self) -> Iterator[DataProto]:
        """The remaining batches of the current epoch; the next ``iter`` starts the next one."""
        self._roll_over()
        epoch = self.epoch
        order = self.order(epoch)
        pad_to = self.dataset.max_prompt_length if self.pad_to_max_length else None
        while self.position < len(self):
            start = self.position * self.batch_size
            rows = order[start : start + self.batch_size]
            uids = [f"{self.dataset.name}-{epoch}-{int(r)}" for r in rows]
            batch = collate_prompts(self.dataset, rows, uids, pad_to=pad_to)
            batch.meta_info["epoch"] = epoch
            # Count the batch as consumed before handing it out: a checkpoint written while
            # the trainer works on it must resume after it.
            self.position += 1
            yield batch
        self._roll_over()

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position", "seed"}``; position counts batches handed out this epoch."""
        epoch, position = self.epoch, self.position
        if position >= len(self):
            epoch, position = epoch + 1, 0
        return {"epoch": epoch, "position": position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        try:
            epoch, position, seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        except (KeyError, TypeError, ValueError) as err:
            msg = f"dataloader state {state!r} lacks an integer epoch, position or seed"
            raise DataError(msg) from err
        if seed != self.seed:
            log.warning(
                "resuming the %s dataloader with seed %d (was %d)",
                self.dataset.name,
                seed,
                self.seed,
            )
        if not 0 <= position <= len(self):
            msg = (
                f"dataloader state position {position} is outside 0..{len(self)}: the "
                f"{self.dataset.name} set or batch size changed since the checkpoint"
            )
            raise DataError(msg)
        self.epoch, self.position, self.seed = epoch, position, seed
