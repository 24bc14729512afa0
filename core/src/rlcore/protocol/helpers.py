"""Private helpers of :mod:`rlcore.protocol`: key lists, index normalisation, deep equality
with a cycle guard, meta_info merging."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np
import torch

from rlcore.errors import DataProtoError

Index: TypeAlias = (
    "int | np.integer[Any] | slice | Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor"
)
Keys: TypeAlias = "str | Iterable[str] | None"


class DataProtoIndexError(DataProtoError, IndexError):
    """A row index is out of range (also an ``IndexError``, so ``for row in data`` stops)."""


def _as_row_array(value: Any, key: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple):
        # One element per row, whatever the elements are (np.array would turn a list of
        # equal-length lists into a 2-D array).
        arr = np.empty(len(value), dtype=object)
        for i, v in enumerate(value):
            arr[i] = v
        return arr
    msg = f"non_tensor_batch[{key!r}] is a {type(value).__name__}; give a numpy array or list"
    raise DataProtoError(msg)


def _check_rows(
    name: str, shape: tuple[int, ...], first: tuple[str, int] | None
) -> tuple[str, int]:
    if len(shape) == 0:
        msg = f"{name} is 0-dimensional; every entry needs a row dimension"
        raise DataProtoError(msg)
    if first is not None and shape[0] != first[1]:
        msg = f"{name} has {shape[0]} rows but {first[0]} has {first[1]}"
        raise DataProtoError(msg)
    return first or (name, int(shape[0]))


def _keys(keys: Keys) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def _require_keys(d: dict[str, Any], keys: list[str], name: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        msg = f"{name} has no keys {missing}; present: {sorted(d)}"
        raise DataProtoError(msg)


def _pick(d: dict[str, Any], keys: Keys, name: str) -> dict[str, Any]:
    if keys is None:
        return dict(d)
    wanted = _keys(keys)
    _require_keys(d, wanted, name)
    return {k: d[k] for k in wanted}


def _normalize_indices(idxs: Index, n: int) -> np.ndarray:
    """Int64 indices in [0, n) from ints, a bool mask, a list, an array or a tensor."""
    if isinstance(idxs, torch.Tensor):
        idxs = idxs.detach().cpu().numpy()
    arr = np.asarray(idxs)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            msg = f"boolean mask has shape {arr.shape}; expected ({n},)"
            raise DataProtoError(msg)
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        msg = f"row indices must be a 1-D integer or boolean sequence, got {arr.dtype} {arr.shape}"
        raise DataProtoError(msg)
    if arr.min() < -n or arr.max() >= n:
        msg = f"row index out of range for a DataProto of {n} rows"
        raise DataProtoIndexError(msg)
    return np.where(arr < 0, arr + n, arr).astype(np.int64)


def _values_equal(a: Any, b: Any, _path: set[tuple[int, int]] | None = None) -> bool:
    """Equality for union/concat conflicts: tensors, arrays (NaN equals NaN), anything else.

    Containers (object arrays, dicts, lists, tuples) are compared element by element. A pair
    already being compared further up the same path is a cycle (an object array holding
    itself): it counts as equal there, as in verl's ``_deep_equal``, instead of recursing
    without end.
    """
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if not (a.dtype.hasobject or b.dtype.hasobject):
            both_float = a.dtype.kind in "fc" and b.dtype.kind in "fc"
            return bool(np.array_equal(a, b, equal_nan=both_float))
        pairs: Iterable[tuple[Any, Any]] = zip(a.reshape(-1), b.reshape(-1))
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        pairs = ((a[k], b[k]) for k in a)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        pairs = zip(a, b)
    else:
        try:
            return bool(a == b) or (a != a and b != b)  # NaN == NaN here
        except (TypeError, ValueError, RecursionError):
            return False
    path = set() if _path is None else _path
    key = (id(a), id(b))
    if key in path:
        return True
    path.add(key)
    try:
        return all(_values_equal(x, y, path) for x, y in pairs)
    finally:
        path.discard(key)


def _merge_meta(data: Sequence[Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    metrics: dict[str, list[Any]] = {}
    has_metrics = False
    for i, d in enumerate(data):
        for key, val in d.meta_info.items():
            if key == "metrics":
                if val is None:
                    continue
                has_metrics = True
                for worker_metrics in val if isinstance(val, list) else [val]:
                    if not isinstance(worker_metrics, dict):
                        msg = f"concat: part {i} meta_info['metrics'] holds a {type(worker_metrics).__name__}, not a dict"  # noqa: E501
                        raise DataProtoError(msg)
                    for name, v in worker_metrics.items():
                        bucket = metrics.setdefault(name, [])
                        if isinstance(v, list):
                            bucket.extend(v)
                        else:
                            bucket.append(v)
            elif key in merged:
                if not _values_equal(merged[key], val):
                    msg = f"concat conflict: meta_info[{key!r}] differs between parts 0..{i}"
                    raise DataProtoError(msg)
            else:
                merged[key] = val
    if has_metrics:
        merged["metrics"] = metrics
    return merged
