"""Reading a torch distributed checkpoint (DCP) without running its code.

torch's DCP reads ``<engine dir>/.metadata`` with a plain ``pickle.load`` and the non-tensor
items of a shard (optimizer hyper-parameters) with ``torch.load(weights_only=False)``: a crafted
checkpoint would run its code in whichever process loads it. Here :func:`load_dcp_metadata`
unpickles ``.metadata`` with :class:`MetadataUnpickler`, which admits only DCP's own metadata
classes (and ``torch.Size``, dtypes, layouts, paths), refusing any other global in one line
naming the file and the global; :func:`safe_storage_reader` and :func:`safe_load_planner` are
what an engine passes to ``dcp.load`` (:func:`safe_dcp_load`) so the workers read metadata the
same way and bytes items with ``weights_only=True``. torch is imported only when a file is
read.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

from rlcore.checkpoint.layout import (
    CheckpointError,
)

_DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
# Every global a DCP ``.metadata`` of torch 2.x refers to; nothing here runs code on load.
_ALLOWED_GLOBALS: dict[str, frozenset[str]] = {
    _DCP_METADATA_MODULE: frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # str -> torch.layout, a dict lookup
    "torch": frozenset({"Size"}),  # and dtypes, checked by type below
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file would run code when loaded: refused, never skipped quietly."""


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler for DCP ``.metadata`` files: only the metadata classes are admitted."""

    def __init__(self, file: Any, *, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            import torch

            value = getattr(torch, name, None)
            if isinstance(value, torch.dtype):
                return value
        msg = (
            f"refusing to load {self.source}: it refers to {module}.{name}, which is not part "
            "of a checkpoint's metadata (the file may have been crafted to run code); use a "
            "checkpoint you wrote"
        )
        raise UnsafeCheckpointError(msg)


def load_dcp_metadata(path: str | os.PathLike[str]) -> Any:
    """The ``Metadata`` in ``path`` (a DCP ``.metadata`` file), unpickled safely."""
    from torch.distributed.checkpoint.metadata import Metadata

    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as err:
        msg = f"cannot read {file}: {err.strerror or err}"
        raise CheckpointError(msg) from err
    try:
        loaded = MetadataUnpickler(io.BytesIO(data), source=str(file)).load()
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # truncated or garbage bytes: any unpickling error
        msg = f"cannot read {file}: not a checkpoint metadata file ({type(err).__name__}: {err})"
        raise CheckpointError(msg) from err
    if not isinstance(loaded, Metadata):
        msg = f"cannot read {file}: it holds a {type(loaded).__name__}, not checkpoint metadata"
        raise CheckpointError(msg)
    problem = _metadata_type_problem(loaded)
    if problem:
        msg = f"cannot read {file}: {problem} (the file is damaged or was crafted)"
        raise CheckpointError(msg)
    return loaded


def _kind(value: Any) -> str:
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool, not a subclass with its own __index__


def _is_shape(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Size) and all(_is_int(n) and n >= 0 for n in value)


def _metadata_type_problem(metadata: Any) -> str | None:
    """The first field of an unpickled ``Metadata`` whose type is not what DCP writes.

    The unpickler admits only metadata classes, but their fields can hold any admitted
    value (a path as an offset, a list as the state-dict map); DCP and the checks below
    would fail on them with a traceback, so each field is checked here, once.
    """
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    missing: Any = object()
    items = getattr(metadata, "state_dict_metadata", missing)
    if not isinstance(items, dict):
        return f"state_dict_metadata is a {_kind(items)}, not a dict"
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            return f"state_dict_metadata has a key of type {_kind(fqn)}, not str"
        where = f"state_dict_metadata[{fqn[:80]!r}]"
        if isinstance(item, BytesStorageMetadata):
            continue
        if not isinstance(item, TensorStorageMetadata):
            return f"{where} is a {_kind(item)}, not tensor or bytes metadata"
        size = getattr(item, "size", missing)
        if not _is_shape(size):
            return f"{where}.size is a {_kind(size)}, not a torch.Size of ints"
        props = getattr(item, "properties", missing)
        if not isinstance(props, TensorProperties) or not isinstance(
            getattr(props, "dtype", missing), torch.dtype
        ):
            return f"{where}.properties is not TensorProperties with a torch dtype"
        chunks = getattr(item, "chunks", missing)
        if not isinstance(chunks, list):
            return f"{where}.chunks is a {_kind(chunks)}, not a list"
        for chunk in chunks:
            if not isinstance(chunk, ChunkStorageMetadata):
                return f"{where}.chunks holds a {_kind(chunk)}, not chunk metadata"
            for field in ("offsets", "sizes"):
                value = getattr(chunk, field, missing)
                if not _is_shape(value) or len(value) != len(size):
                    return f"{where}.chunks[].{field} is not a torch.Size of {len(size)} ints"
    storage = getattr(metadata, "storage_data", missing)
    if storage is not None and not isinstance(storage, dict):
        return f"storage_data is a {_kind(storage)}, not a dict"
    for index, info in (storage or {}).items():
        if not isinstance(index, MetadataIndex) or not isinstance(
            getattr(index, "fqn", missing), str
        ):
            return f"storage_data has a key of type {_kind(index)}, not a MetadataIndex"
        where = f"storage_data[{index.fqn[:80]!r}]"
        offset = getattr(index, "offset", missing)
        if offset is not None and not _is_shape(offset):
            return f"the key of {where} has an offset of type {_kind(offset)}"
        if not isinstance(info, _StorageInfo):
            return f"{where} is a {_kind(info)}, not storage info"
        if not isinstance(getattr(info, "relative_path", missing), str):
            return f"{where}.relative_path is a {_kind(getattr(info, 'relative_path', None))}"
        for field in ("offset", "length"):
            value = getattr(info, field, missing)
            if not _is_int(value) or value < 0:
                return f"{where}.{field} is a {_kind(value)}, not a non-negative int"
        transforms = getattr(info, "transform_descriptors", None)
        if transforms is not None and not (
            isinstance(transforms, list | tuple) and all(isinstance(t, str) for t in transforms)
        ):
            return f"{where}.transform_descriptors is not a list of str"
    planner = getattr(metadata, "planner_data", None)
    if planner is not None and not isinstance(planner, dict):
        return f"planner_data is a {_kind(planner)}, not a dict"
    meta = getattr(metadata, "storage_meta", None)
    if meta is not None and not isinstance(meta, StorageMeta):
        return f"storage_meta is a {_kind(meta)}, not StorageMeta"
    return None


def _reader_classes() -> tuple[type, type]:
    # Defined lazily: subclassing torch's classes at import time would import torch.
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _SafeFileSystemReader(FileSystemReader):  # type: ignore[misc]
        """``FileSystemReader`` whose metadata goes through :class:`MetadataUnpickler`."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = self._get_metadata_path(kwargs.get("rank"))
            try:
                metadata = load_dcp_metadata(path)
            except UnsafeCheckpointError as err:
                # dcp.load swallows this and tries rank-local metadata; keep it for the caller.
                self.refused = err
                raise
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class _SafeLoadPlanner(DefaultLoadPlanner):  # type: ignore[misc]
        """``DefaultLoadPlanner`` that loads bytes items with ``weights_only=True``."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            import torch
            from torch.distributed.checkpoint._traverse import set_element

            try:
                obj = torch.load(value, weights_only=True, map_location="cpu")
            except pickle.UnpicklingError as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else "refused"
                msg = (
                    f"refusing to load item {read_item.dest_index.fqn!r} of a checkpoint: not "
                    f"a plain value ({first})"
                )
                self.refused = UnsafeCheckpointError(msg)
                raise self.refused from err
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return _SafeFileSystemReader, _SafeLoadPlanner


def safe_storage_reader(path: str | os.PathLike[str]) -> Any:
    """A DCP storage reader for ``path`` that never unpickles arbitrary objects."""
    return _reader_classes()[0](path)


def safe_load_planner() -> Any:
    """A DCP load planner whose bytes items are loaded with ``weights_only=True``."""
    return _reader_classes()[1]()


def safe_dcp_load(state_dict: dict[str, Any], path: str | os.PathLike[str], **kwargs: Any) -> None:
    """``dcp.load(state_dict, checkpoint_id=path)`` without running code from the checkpoint."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    reader, planner = safe_storage_reader(path), safe_load_planner()
    try:
        dcp_load(state_dict, storage_reader=reader, planner=planner, **kwargs)
    except CheckpointException:
        # torch wraps every rank's error in one multi-line exception: surface our refusal.
        refused = getattr(reader, "refused", None) or getattr(planner, "refused", None)
        if refused is None:
            raise
        raise refused from None
