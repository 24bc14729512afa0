"""How DataProto crosses process boundaries: tensors as numpy buffers, disk files without pickle.

Through Ray (and plain pickle) a tensor travels as the numpy array that shares its memory. Ray
ships numpy arrays as pickle-5 out-of-band buffers, which is measured here 2-3x faster than
torch's own reducer for the same bytes. Dtypes numpy lacks (bfloat16, float8, complex32) travel
as same-width integers and are viewed back on arrival.

On disk a DataProto is a ``torch.save`` file that ``torch.load(weights_only=True)`` can read:
tensors, plain Python containers and scalars only. Numpy arrays are encoded as tagged tuples of
(dtype, shape, raw bytes) or, for object arrays, of their elements, so loading never runs a
pickled constructor. Anything else is refused when saving, naming where it sits.
"""

from __future__ import annotations

import os
import pickle
import warnings
import weakref
from typing import Any

import numpy as np
import torch

from rlcore.errors import DataProtoError

# Width in bytes -> integer dtype used to carry a tensor whose dtype numpy cannot represent.
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Tags of encoded values on disk. Every tuple in an encoded tree is one of these, because real
# tuples are encoded too, so a user value cannot be mistaken for a tag.
_ND = "__rlcore_ndarray__"
_NDOBJ = "__rlcore_ndarray_object__"
_NPSCALAR = "__rlcore_numpy_scalar__"
_TUPLE = "__rlcore_tuple__"

# What a DataProto file says it is (``DataProto.save_to_disk``).
_FILE_FORMAT = "rlcore.DataProto"
_FILE_VERSION = 1


# --- tensors <-> numpy (pickle / Ray) ---------------------------------------------------------


def tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """Return a numpy array sharing ``t``'s memory where possible, and the torch dtype to restore.

    The second item is ``None`` when the numpy dtype restores the same torch dtype.
    GPU tensors are copied to CPU; non-contiguous ones are made contiguous (numpy would send a
    strided view as a copy anyway).
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    try:
        return t.numpy(), None
    except TypeError:
        carrier = _CARRIER.get(t.element_size())
        if carrier is None:
            msg = f"cannot serialise a tensor of dtype {t.dtype}: no integer type of its width"
            raise DataProtoError(msg) from None
        return t.view(carrier).numpy(), str(t.dtype).removeprefix("torch.")


def numpy_to_tensor(arr: np.ndarray, torch_dtype: str | None) -> torch.Tensor:
    """Inverse of :func:`tensor_to_numpy`, zero-copy.

    A read-only ``arr`` (Ray hands back read-only views into its shared-memory object store)
    is registered as shared: a tensor has no read-only flag, so an in-place op on it would
    silently change the stored object for every other reader (a ONE_TO_ALL broadcast, say).
    ``DataProto.batch`` copies registered tensors on first access (:func:`materialize`); the
    methods that only read them (concat, to(device), pickling again) do not pay for that copy.
    """
    if not arr.flags.writeable and arr.size > 0:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(arr)
        ptr = t.untyped_storage().data_ptr()
        _SHARED[ptr] = _SHARED.get(ptr, 0) + 1
        # The tensor (and every view of it) keeps ``arr`` alive; when the last one goes, so
        # does the registration. A count: two gets of one object share one buffer.
        weakref.finalize(arr, _unregister, ptr)
    else:
        t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
    if torch_dtype is not None:
        t = t.view(getattr(torch, torch_dtype))
    return t


# Storage address -> number of live read-only numpy arrays there (Ray shared memory).
_SHARED: dict[int, int] = {}


def _unregister(ptr: int) -> None:
    count = _SHARED.get(ptr, 0) - 1
    if count > 0:
        _SHARED[ptr] = count
    else:
        _SHARED.pop(ptr, None)


def has_shared_memory() -> bool:
    """Whether any tensor in this process may alias read-only shared memory (cheap check)."""
    return bool(_SHARED)


def is_shared(t: torch.Tensor) -> bool:
    """Whether ``t`` (or the tensor it is a view of) aliases read-only shared memory."""
    return t.device.type == "cpu" and t.untyped_storage().data_ptr() in _SHARED


def materialize(batch: dict[str, torch.Tensor]) -> None:
    """Replace, in place, every tensor of ``batch`` that aliases shared memory by a copy."""
    for key, t in batch.items():
        if is_shared(t):
            batch[key] = t.clone()


# --- disk: a tree that torch.load(weights_only=True) accepts ---------------------------------


def encode_safe(obj: Any, where: str) -> Any:
    """Encode ``obj`` into tensors, plain containers and scalars; ``where`` names it in errors."""
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes):
        return obj
    if isinstance(obj, torch.Tensor):
        return compact_tensor(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            if obj.dtype != np.dtype(object):
                msg = f"cannot save {where}: structured numpy dtype {obj.dtype} holds objects"
                raise DataProtoError(msg)
            flat = obj.reshape(-1)
            items = [encode_safe(x, f"{where}[{i}]") for i, x in enumerate(flat)]
            return (_NDOBJ, list(obj.shape), items)
        if obj.dtype.fields is not None:
            msg = f"cannot save {where}: structured numpy dtype {obj.dtype} is not supported"
            raise DataProtoError(msg)
        return (_ND, obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes())
    if isinstance(obj, np.generic):
        return (_NPSCALAR, obj.dtype.str, obj.tobytes())
    if isinstance(obj, list):
        return [encode_safe(x, f"{where}[{i}]") for i, x in enumerate(obj)]
    if isinstance(obj, tuple):
        return (_TUPLE, [encode_safe(x, f"{where}[{i}]") for i, x in enumerate(obj)])
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str | int | float | bool) and k is not None:
                msg = f"cannot save {where}: dict key {k!r} is a {type(k).__name__}"
                raise DataProtoError(msg)
            out[k] = encode_safe(v, f"{where}[{k!r}]")
        return out
    msg = (
        f"cannot save {where}: a {type(obj).__module__}.{type(obj).__qualname__} is not a tensor, "
        "numpy array, number, str, bytes, None, list, tuple or dict; convert it first"
    )
    raise DataProtoError(msg)


def decode_safe(obj: Any) -> Any:
    """Inverse of :func:`encode_safe`."""
    if isinstance(obj, tuple):
        tag = obj[0] if obj else None
        if tag == _ND:
            _, dtype, shape, raw = obj
            return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
        if tag == _NDOBJ:
            _, shape, items = obj
            arr = np.empty(len(items), dtype=object)
            # Element-wise: assigning a list of equal-length lists would broadcast into 2-D.
            for i, x in enumerate(items):
                arr[i] = decode_safe(x)
            return arr.reshape(shape)
        if tag == _NPSCALAR:
            _, dtype, raw = obj
            return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
        if tag == _TUPLE:
            return tuple(decode_safe(x) for x in obj[1])
        msg = f"unexpected tuple {str(obj)[:60]!r} in a DataProto file (not written by rlcore?)"
        raise DataProtoError(msg)
    if isinstance(obj, list):
        return [decode_safe(x) for x in obj]
    if isinstance(obj, dict):
        return {k: decode_safe(v) for k, v in obj.items()}
    return obj


def compact_tensor(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor owning exactly its bytes: ``torch.save`` writes a view's whole storage."""
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone(memory_format=torch.contiguous_format)
    return t


# --- DataProto files ---------------------------------------------------------------------------


def save_file(
    filepath: str | os.PathLike[str],
    batch: dict[str, torch.Tensor],
    non_tensors: dict[str, np.ndarray],
    meta_info: dict[str, Any],
) -> None:
    """A DataProto's three parts to a file :func:`load_file` reads with ``weights_only``."""
    payload = {
        "format": _FILE_FORMAT,
        "version": _FILE_VERSION,
        "batch": {k: compact_tensor(v) for k, v in batch.items()},
        "non_tensor_batch": {
            k: encode_safe(v, f"non_tensor_batch[{k!r}]") for k, v in non_tensors.items()
        },
        "meta_info": encode_safe(meta_info, "meta_info"),
    }
    torch.save(payload, filepath)


def load_file(
    filepath: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """``(batch, non_tensor_batch, meta_info)`` from a file :func:`save_file` wrote."""
    try:
        payload = torch.load(filepath, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        msg = (
            f"cannot read a DataProto from {os.fspath(filepath)}: it holds objects that "
            "weights_only loading refuses (not written by save_to_disk?)"
        )
        raise DataProtoError(msg) from err
    except (OSError, RuntimeError, EOFError) as err:
        msg = f"cannot read a DataProto from {os.fspath(filepath)}: {err}".splitlines()[0]
        raise DataProtoError(msg) from err
    if not isinstance(payload, dict) or payload.get("format") != _FILE_FORMAT:
        msg = f"{os.fspath(filepath)} is not a DataProto file written by save_to_disk"
        raise DataProtoError(msg)
    if payload.get("version") != _FILE_VERSION:
        msg = f"{os.fspath(filepath)} has DataProto file version {payload.get('version')!r}"
        raise DataProtoError(msg)
    non_tensors = {k: decode_safe(v) for k, v in payload["non_tensor_batch"].items()}
    return payload["batch"], non_tensors, decode_safe(payload["meta_info"])
