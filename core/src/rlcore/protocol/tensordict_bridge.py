"""DataProto <-> ``tensordict.TensorDict``, for code that uses verl's TensorDict layout.

tensordict is optional: it is imported here, on use, and a missing install is one error line
saying how to get it. The layout is verl's ``DataProto.to_tensordict``: tensors as they are,
each per-row value list as a ``NonTensorStack`` of ``NonTensorData``, each meta_info entry as
one ``NonTensorData``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlcore.errors import DataProtoError


def _tensordict() -> Any:
    try:
        import tensordict
    except ImportError:
        msg = (
            "to_tensordict/from_tensordict need the optional tensordict package: "
            "pip install tensordict (without it DataProto works on plain dicts)"
        )
        raise DataProtoError(msg) from None
    return tensordict


def to_tensordict(
    batch: dict[str, torch.Tensor],
    non_tensor_batch: dict[str, np.ndarray],
    meta_info: dict[str, Any],
    rows: int,
) -> Any:
    td = _tensordict()
    clash = sorted(batch.keys() & non_tensor_batch.keys() | batch.keys() & meta_info.keys())
    clash += sorted(non_tensor_batch.keys() & meta_info.keys())
    if clash:
        msg = f"to_tensordict: keys {clash} appear in more than one part of the DataProto"
        raise DataProtoError(msg)
    source: dict[str, Any] = dict(batch)
    for key, values in non_tensor_batch.items():
        source[key] = td.NonTensorStack.from_list([td.NonTensorData(v) for v in values])
    out = td.TensorDict(source, batch_size=[rows])
    for key, value in meta_info.items():
        out[key] = td.NonTensorData(value)
    return out


def from_tensordict(
    tensor_dict: Any,
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray], dict[str, Any]]:
    td = _tensordict()
    if not isinstance(tensor_dict, td.TensorDictBase):
        msg = f"from_tensordict needs a TensorDict, got {type(tensor_dict).__name__}"
        raise DataProtoError(msg)
    tensors: dict[str, torch.Tensor] = {}
    non_tensors: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for key in list(tensor_dict.keys()):  # TensorDict iterates over rows, not keys
        # Unwrapped access: a NonTensorStack/NonTensorData comes back as itself.
        val = tensor_dict.get(key)
        if isinstance(val, td.NonTensorStack):
            items = val.tolist()
            arr = np.empty(len(items), dtype=object)
            for i, item in enumerate(items):
                arr[i] = item
            non_tensors[str(key)] = arr
        elif isinstance(val, td.NonTensorData):
            meta[str(key)] = val.data
        elif isinstance(val, torch.Tensor):
            tensors[str(key)] = val
        else:
            msg = (
                f"from_tensordict: entry {key!r} is a {type(val).__name__}; nested TensorDicts "
                "are not supported (flatten them first)"
            )
            raise DataProtoError(msg)
    return tensors, non_tensors, meta
