"""Row-level helpers of :mod:`rlcore.protocol` that verl keeps as module functions: padding
for data-parallel dispatch and folding rows. Import them from :mod:`rlcore.protocol`."""

from __future__ import annotations

import logging

import numpy as np

from rlcore.errors import DataProtoError
from rlcore.protocol.dataproto import DataProto

log = logging.getLogger("rlcore.protocol")


# --- padding for data-parallel dispatch -----------------------------------------------------


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` to a multiple of ``size_divisor`` rows by repeating rows from the start.

    Returns ``(padded, pad_size)``; undo with ``unpad_dataproto(result, pad_size)``.
    meta_info is kept as is (not merged with itself, so metrics are not duplicated).
    """
    if not isinstance(size_divisor, int) or size_divisor < 1:
        msg = f"size_divisor must be a positive int, got {size_divisor!r}"
        raise DataProtoError(msg)
    n = len(data)
    if n == 0:
        log.warning("padding an empty DataProto: nothing to repeat, returned unchanged")
        return data, 0
    pad_size = -n % size_divisor
    if pad_size == 0:
        return data, 0
    idx = np.concatenate([np.arange(n), np.arange(pad_size) % n])
    return data.select_idxs(idx), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if not isinstance(pad_size, int) or not 0 <= pad_size <= len(data):
        msg = f"pad_size must be an int in [0, {len(data)}], got {pad_size!r}"
        raise DataProtoError(msg)
    if pad_size == 0:
        return data
    return data[: len(data) - pad_size]  # type: ignore[no-any-return]


# --- verl's folding of rows -----------------------------------------------------------------


def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Rows ``(bsz, ...)`` -> ``(new_batch_size, bsz // new_batch_size, ...)`` for every entry."""
    return data.fold_batch_dim(new_batch_size)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """The first ``batch_dims`` dims of every entry become one row dim (undoes the fold)."""
    return data.unfold_batch_dim(batch_dims)
