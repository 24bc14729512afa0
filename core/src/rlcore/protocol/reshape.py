"""Rows repeated, and dims moved between rows and columns: the tensor and non-tensor halves of a
:class:`~rlcore.protocol.DataProto` reshaped alike, each problem named in one line.

Every function takes and returns ``(batch, non_tensor_batch)``; the DataProto methods of verl's
names (``repeat``, ``unfold_column_chunks``, ``fold_batch_dim``, ``unfold_batch_dim``) wrap them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rlcore.errors import DataProtoError

Tensors = dict[str, torch.Tensor]
Arrays = dict[str, np.ndarray]


def repeat_rows(
    batch: Tensors, non_tensors: Arrays, k: int, interleave: bool
) -> tuple[Tensors, Arrays]:
    """Interleaved (row i at rows i*k..i*k+k-1) or tiled (the whole batch k times)."""
    if not isinstance(k, int) or k < 1:
        msg = f"repeat_times must be a positive int, got {k!r}"
        raise DataProtoError(msg)
    if interleave:
        return (
            {key: torch.repeat_interleave(v, k, dim=0) for key, v in batch.items()},
            {key: np.repeat(v, k, axis=0) for key, v in non_tensors.items()},
        )
    return (
        {key: v.repeat(k, *([1] * (v.dim() - 1))) for key, v in batch.items()},
        {key: np.tile(v, (k,) + (1,) * (v.ndim - 1)) for key, v in non_tensors.items()},
    )


def unfold_columns(
    batch: Tensors, non_tensors: Arrays, n_split: int, split_keys: Sequence[str] | None
) -> tuple[Tensors, Arrays]:
    """Dim 1 of each of ``split_keys`` cut into ``n_split`` parts moved to rows; the other keys
    repeated to match (all of them when ``split_keys`` is None)."""
    if not isinstance(n_split, int) or n_split < 1:
        msg = f"unfold_column_chunks: n_split must be a positive int, got {n_split!r}"
        raise DataProtoError(msg)
    keys = set(split_keys or ())
    unknown = keys - batch.keys() - non_tensors.keys()
    if unknown:
        msg = f"unfold_column_chunks: no keys {sorted(unknown)} in batch or non_tensor_batch"
        raise DataProtoError(msg)

    def unfold(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) < 2 or shape[1] % n_split:
            msg = (
                f"unfold_column_chunks: {name} has shape {shape}; dim 1 must divide into "
                f"{n_split} parts"
            )
            raise DataProtoError(msg)
        return (shape[0] * n_split, shape[1] // n_split, *shape[2:])

    return (
        {
            k: v.reshape(unfold(k, tuple(v.shape)))
            if k in keys
            else torch.repeat_interleave(v, n_split, dim=0)
            for k, v in batch.items()
        },
        {
            k: v.reshape(unfold(k, v.shape)) if k in keys else np.repeat(v, n_split, axis=0)
            for k, v in non_tensors.items()
        },
    )


def fold_rows(
    batch: Tensors, non_tensors: Arrays, n: int, new_batch_size: int
) -> tuple[Tensors, Arrays]:
    """``n`` rows ``(n, ...)`` -> ``(new_batch_size, n // new_batch_size, ...)``."""
    if not isinstance(new_batch_size, int) or new_batch_size < 1 or n % new_batch_size:
        msg = f"fold_batch_dim: {n} rows do not fold into {new_batch_size!r} equal rows"
        raise DataProtoError(msg)
    return (
        {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in batch.items()},
        {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in non_tensors.items()},
    )


def unfold_rows(batch: Tensors, non_tensors: Arrays, batch_dims: int) -> tuple[Tensors, Arrays]:
    """The first ``batch_dims`` dims of every entry become one row dim."""
    shapes = {
        **{f"batch[{k!r}]": tuple(v.shape) for k, v in batch.items()},
        **{f"non_tensor_batch[{k!r}]": v.shape for k, v in non_tensors.items()},
    }
    leading = {shape[:batch_dims] for shape in shapes.values()}
    if batch_dims < 1 or len(leading) > 1 or any(len(s) < batch_dims for s in shapes.values()):
        msg = (
            f"unfold_batch_dim: entries must share their first {batch_dims} dims, got "
            + ", ".join(f"{k} {v}" for k, v in shapes.items())
        )
        raise DataProtoError(msg)
    return (
        {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in batch.items()},
        {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in non_tensors.items()},
    )
