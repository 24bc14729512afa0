"""Row-level helpers of :mod:`rlcore.protocol` that verl keeps as module functions: padding
for data-parallel dispatch, folding rows, and the process-wide ``DataProtoConfig`` switch.
Import them from :mod:`rlcore.protocol`."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlcore.errors import DataProtoError

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

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
    n = len(data)
    if not isinstance(new_batch_size, int) or new_batch_size < 1 or n % new_batch_size:
        msg = f"fold_batch_dim: {n} rows do not fold into {new_batch_size!r} equal rows"
        raise DataProtoError(msg)
    batch = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data._batch.items()}
    non_tensors = {
        k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """The first ``batch_dims`` dims of every entry become one row dim (undoes the fold)."""
    shapes = {
        **{f"batch[{k!r}]": tuple(v.shape) for k, v in data._batch.items()},
        **{f"non_tensor_batch[{k!r}]": v.shape for k, v in data.non_tensor_batch.items()},
    }
    leading = {shape[:batch_dims] for shape in shapes.values()}
    if batch_dims < 1 or len(leading) > 1 or any(len(s) < batch_dims for s in shapes.values()):
        msg = (
            f"unfold_batch_dim: entries must share their first {batch_dims} dims, got "
            + ", ".join(f"{k} {v}" for k, v in shapes.items())
        )
        raise DataProtoError(msg)
    batch = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data._batch.items()}
    non_tensors = {
        k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensors, meta_info=data.meta_info)


# --- verl's global padding switch -----------------------------------------------------------


class _DataProtoConfigMeta(type):
    _config: ClassVar[dict[str, bool]] = {}
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        """On when set here or by ``VERL_AUTO_PADDING``/``RLCORE_AUTO_PADDING`` = true/1."""
        by_env = any(
            os.environ.get(name, "").strip().upper() in ("TRUE", "1")
            for name in ("VERL_AUTO_PADDING", "RLCORE_AUTO_PADDING")
        )
        return by_env or cls._config.get(cls.auto_padding_key, False)

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            msg = f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}"
            raise DataProtoError(msg)
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto switches, as verl: ``DataProtoConfig.auto_padding = True`` lets
    every DataProto :meth:`~DataProto.chunk` unevenly."""
