"""DataProto: the batch that flows between the driver and the workers, with verl's API.

A DataProto holds three things:

- ``batch``: ``dict[str, torch.Tensor]``, every tensor with the same size of dim 0 (the rows);
- ``non_tensor_batch``: ``dict[str, np.ndarray]``, one entry per row (object arrays for strings,
  dicts, lists; any dtype is accepted);
- ``meta_info``: a plain dict for the whole batch (temperature, metrics, ...).

Names and semantics follow verl's ``verl/protocol.py`` so verl code ports: construction
(``from_dict``/``from_single_dict`` with ``auto_padding``, ``from_tensordict``), indexing,
``select``/``pop``/``rename``/``union``, ``chunk``/``split``/``concat``, ``repeat``,
``sample_level_repeat``, ``unfold_column_chunks``, ``padding``/``is_padding_enabled`` with
``DataProtoConfig.auto_padding``, ``make_iterator``, ``to_tensordict``, ``save_to_disk``, and the
module functions ``pad_dataproto_to_divisor``/``unpad_dataproto``/``fold_batch_dim``/
``unfold_batch_dim``.

Deliberate differences, and why:

- ``batch`` is a plain ``dict[str, Tensor]``, not a TensorDict (``data.batch["x"]`` reads the
  same): tensordict stays optional. ``to_tensordict``/``from_tensordict`` convert when it is
  installed. So ``num_batch_dims`` must be 1; fold rows with ``fold_batch_dim`` instead.
- Inconsistent inputs raise :class:`~rlcore.errors.DataProtoError` with a message naming the
  key, instead of a bare ``assert`` (which ``python -O`` drops). It subclasses both
  ``ValueError`` and ``AssertionError``, so ported ``except AssertionError`` code still works.
- An uneven ``chunk`` with padding enabled always gives ``chunks`` parts (sizes differ by at
  most one); verl's TensorDict.chunk may give fewer.
- ``unfold_column_chunks(n, split_keys=None)`` repeats every key, tensors and non-tensors alike
  (verl fails on non-tensor keys when ``split_keys`` is None).
- ``save_to_disk`` writes a file that loads without unpickling arbitrary objects.

Pickling (and so Ray) carries tensors as numpy buffers; see :mod:`rlcore.protocol.serialize`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, Self

import numpy as np
import torch

from rlcore.errors import DataProtoError
from rlcore.protocol.helpers import (
    DataProtoIndexError,
    Index,
    Keys,
    _as_row_array,
    _check_rows,
    _keys,
    _merge_meta,
    _normalize_indices,
    _pick,
    _require_keys,
    _values_equal,
)
from rlcore.protocol.reshape import fold_rows, repeat_rows, unfold_columns, unfold_rows
from rlcore.protocol.serialize import (
    has_shared_memory,
    load_file,
    materialize,
    numpy_to_tensor,
    save_file,
    tensor_to_numpy,
)
from rlcore.protocol.settings import DataProtoConfig

log = logging.getLogger(__name__)

__all__ = ["DataProto", "DataProtoItem"]


@dataclasses.dataclass
class DataProtoItem:
    """One row of a DataProto: tensors without dim 0, the row's non-tensor values, meta_info."""

    batch: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = dataclasses.field(default_factory=dict)
    meta_info: dict[str, Any] = dataclasses.field(default_factory=dict)


class DataProto:
    """Tensors and per-row values sharing dim 0, plus batch-wide ``meta_info`` (verl's API)."""

    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    def __init__(
        self,
        batch: dict[str, torch.Tensor] | None = None,
        non_tensor_batch: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> None:
        self._batch = dict(batch) if batch is not None else {}
        self.non_tensor_batch = {
            k: _as_row_array(v, k) for k, v in (non_tensor_batch or {}).items()
        }
        self.meta_info = dict(meta_info) if meta_info is not None else {}
        self.check_consistency()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> Self:
        """Build from tensors, per-row values (lists become object arrays) and meta_info.

        ``auto_padding=True`` marks this DataProto (in meta_info, under verl's key) so that
        :meth:`chunk` accepts a row count that does not divide evenly. ``num_batch_dims``
        other than 1 is refused: the batch here has one row dimension (fold rows with
        :func:`fold_batch_dim` instead).
        """
        if num_batch_dims != 1:
            msg = (
                f"from_dict: num_batch_dims={num_batch_dims!r} is not supported (DataProto rows "
                "are dim 0 only); build with 1 and use fold_batch_dim/unfold_batch_dim"
            )
            raise DataProtoError(msg)
        meta = dict(meta_info) if meta_info is not None else {}
        if auto_padding:
            meta[DataProtoConfig.auto_padding_key] = True
        return cls(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta)

    @classmethod
    def from_single_dict(
        cls,
        data: dict[str, torch.Tensor | np.ndarray],
        meta_info: dict[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> Self:
        """Build from one dict, sorting tensors into ``batch`` and numpy arrays into the rest."""
        tensors: dict[str, torch.Tensor] = {}
        non_tensors: dict[str, np.ndarray] = {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, np.ndarray):
                non_tensors[key] = val
            else:
                msg = f"from_single_dict: {key!r} is a {type(val).__name__}, not a tensor or array"
                raise DataProtoError(msg)
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls,
        tensor_dict: Any,
        meta_info: dict[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> Self:
        """From a ``tensordict.TensorDict`` (needs the optional ``tensordict`` package).

        Tensors go to ``batch``, ``NonTensorStack`` entries to ``non_tensor_batch``,
        ``NonTensorData`` entries to ``meta_info`` (as verl's ``to_tensordict`` writes them).
        """
        from rlcore.protocol.tensordict_bridge import from_tensordict

        if num_batch_dims != 1:
            msg = f"from_tensordict: num_batch_dims={num_batch_dims!r} is not supported (use 1)"
            raise DataProtoError(msg)
        tensors, non_tensors, meta = from_tensordict(tensor_dict)
        return cls(
            batch=tensors, non_tensor_batch=non_tensors, meta_info={**meta, **(meta_info or {})}
        )

    def to_tensordict(self) -> Any:
        """A ``tensordict.TensorDict`` with the tensors, per-row values as ``NonTensorStack``
        and meta_info entries as ``NonTensorData`` (verl's layout; needs ``tensordict``)."""
        from rlcore.protocol.tensordict_bridge import to_tensordict

        return to_tensordict(self.batch, self.non_tensor_batch, self.meta_info, len(self))

    def check_consistency(self) -> None:
        """Raise DataProtoError unless every tensor and array has the same number of rows."""
        first: tuple[str, int] | None = None
        for key, t in self._batch.items():
            if not isinstance(t, torch.Tensor):
                msg = f"batch[{key!r}] is a {type(t).__name__}; batch holds torch tensors only"
                raise DataProtoError(msg)
            first = _check_rows(f"batch[{key!r}]", tuple(t.shape), first)
        for key, arr in self.non_tensor_batch.items():
            if not isinstance(arr, np.ndarray):
                msg = f"non_tensor_batch[{key!r}] is a {type(arr).__name__}, not a numpy array"
                raise DataProtoError(msg)
            first = _check_rows(f"non_tensor_batch[{key!r}]", arr.shape, first)
        if not isinstance(self.meta_info, dict):
            msg = f"meta_info is a {type(self.meta_info).__name__}, not a dict"
            raise DataProtoError(msg)

    # --- sizes and indexing -----------------------------------------------------------------

    @property
    def batch(self) -> dict[str, torch.Tensor]:
        """The tensors, all with the same dim 0. A plain dict: ``data.batch["x"] = t`` works.

        Tensors that arrived through Ray and still alias its read-only shared memory are
        copied here, on first access, so in-place writes are safe. Methods of DataProto that
        only read (concat, chunk, to(device), pickling) skip that copy.
        """
        if has_shared_memory():
            materialize(self._batch)
        return self._batch

    @batch.setter
    def batch(self, value: dict[str, torch.Tensor] | None) -> None:
        self._batch = value if value is not None else {}

    def __len__(self) -> int:
        for t in self._batch.values():
            return int(t.shape[0])
        for arr in self.non_tensor_batch.values():
            return int(arr.shape[0])
        return 0

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
            + ("" if v.device.type == "cpu" else f" {v.device}")
            for k, v in self._batch.items()
        )
        arrays = ", ".join(f"{k}: {v.shape} {v.dtype}" for k, v in self.non_tensor_batch.items())
        return (
            f"{type(self).__name__}(len={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={{{arrays}}}, meta_info keys={list(self.meta_info)})"
        )

    def __getitem__(self, item: Index) -> Any:
        """An int gives a :class:`DataProtoItem`; a slice, index array or bool mask a DataProto."""
        if isinstance(item, int | np.integer) and not isinstance(item, bool | np.bool_):
            n = len(self)
            i = int(item)
            if not -n <= i < n:
                msg = f"row {i} is out of range for a DataProto of {n} rows"
                raise DataProtoIndexError(msg)
            return DataProtoItem(
                batch={k: v[i] for k, v in self.batch.items()},  # copies shared rows
                non_tensor_batch={k: v[i] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        return self.select_idxs(item)

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def slice(
        self, start: int | None = None, end: int | None = None, step: int | None = None
    ) -> Self:
        """Rows ``start:end:step``; tensors and arrays are views when ``step`` is positive."""
        s = slice(start, end, step)
        if s.step is not None and s.step < 0:
            # torch slicing has no negative step; gather instead.
            return self.select_idxs(np.arange(len(self))[s])
        if s.step == 0:
            msg = "slice step cannot be zero"
            raise DataProtoError(msg)
        return self._new(
            {k: v[s] for k, v in self._batch.items()},
            {k: v[s] for k, v in self.non_tensor_batch.items()},
        )

    def select_idxs(self, idxs: Index) -> Self:
        """Rows at integer indices (negative allowed) or where a bool mask of len(self) is true."""
        idx = _normalize_indices(idxs, len(self))
        idx_t = torch.from_numpy(idx)
        batch = {}
        for k, v in self._batch.items():
            batch[k] = v.index_select(0, idx_t.to(v.device))
        return self._new(batch, {k: v[idx] for k, v in self.non_tensor_batch.items()})

    # --- keys -------------------------------------------------------------------------------

    def select(
        self,
        batch_keys: Keys = None,
        non_tensor_batch_keys: Keys = None,
        meta_info_keys: Keys = None,
        deepcopy: bool = False,
    ) -> Self:
        """A DataProto with only the named keys (``None`` keeps all keys of that part).

        Tensors are shared, not copied (as in verl); ``deepcopy`` copies the rest.
        """
        batch = _pick(self._batch, batch_keys, "batch")
        non_tensors = _pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta = _pick(self.meta_info, meta_info_keys, "meta_info")
        if deepcopy:
            non_tensors = copy.deepcopy(non_tensors)
            meta = copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def pop(
        self,
        batch_keys: Keys = None,
        non_tensor_batch_keys: Keys = None,
        meta_info_keys: Keys = None,
    ) -> Self:
        """Remove the named keys (``None`` removes none) and return them as a new DataProto."""
        parts = (
            (self._batch, _keys(batch_keys), "batch"),
            (self.non_tensor_batch, _keys(non_tensor_batch_keys), "non_tensor_batch"),
            (self.meta_info, _keys(meta_info_keys), "meta_info"),
        )
        for d, keys, name in parts:  # check everything first: a failed pop changes nothing
            _require_keys(d, keys, name)
        popped: list[dict[str, Any]] = [{k: d.pop(k) for k in keys} for d, keys, _ in parts]
        return type(self)(batch=popped[0], non_tensor_batch=popped[1], meta_info=popped[2])

    def rename(self, old_keys: Keys = None, new_keys: Keys = None) -> Self:
        """Rename ``batch`` keys in place, pairwise; returns self."""
        old, new = _keys(old_keys), _keys(new_keys)
        if len(old) != len(new):
            msg = f"rename got {len(old)} old keys but {len(new)} new keys"
            raise DataProtoError(msg)
        _require_keys(self._batch, old, "batch")
        clash = [k for k in new if k in self._batch and k not in old]
        if clash or len(set(new)) != len(new):
            msg = f"rename would overwrite batch keys {clash or new}"
            raise DataProtoError(msg)
        moved = {n: self._batch.pop(o) for o, n in zip(old, new)}
        self._batch.update(moved)
        return self

    def union(self, other: DataProto) -> Self:
        """Add ``other``'s keys in place and return self; shared keys must hold equal values."""
        both_have_rows = bool(self._batch or self.non_tensor_batch) and bool(
            other._batch or other.non_tensor_batch
        )
        if both_have_rows and len(self) != len(other):
            msg = f"union of DataProtos with {len(self)} and {len(other)} rows"
            raise DataProtoError(msg)
        for name, mine, theirs in (
            ("batch", self._batch, other._batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        ):
            for key in mine.keys() & theirs.keys():
                if not _values_equal(mine[key], theirs[key]):
                    msg = f"union conflict: {name}[{key!r}] differs between the two DataProtos"
                    raise DataProtoError(msg)
        self._batch.update(other._batch)
        self.non_tensor_batch.update(other.non_tensor_batch)
        self.meta_info.update(other.meta_info)
        return self

    def __or__(self, other: DataProto) -> Self:
        """``a | b``: a new DataProto with the union (``a`` unchanged)."""
        return copy.copy(self).union(other)

    def __ior__(self, other: DataProto) -> Self:
        """``batch |= other``: union in place."""
        return self.union(other)

    # --- splitting and joining ------------------------------------------------------------------

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join along rows. meta_info must agree, except ``metrics``, which is merged per name.

        Each part's ``meta_info["metrics"]`` (a dict, or a list of dicts) contributes to one
        ``{name: [values...]}``: scalar values are appended, list values extended, in order.
        """
        if not data:
            msg = "concat needs at least one DataProto"
            raise DataProtoError(msg)
        first = data[0]
        for i, d in enumerate(data[1:], start=1):
            for name, a, b in (
                ("batch", first._batch, d._batch),
                ("non_tensor_batch", first.non_tensor_batch, d.non_tensor_batch),
            ):
                if a.keys() != b.keys():
                    msg = f"concat: part {i} has {name} keys {sorted(b)} but part 0 has {sorted(a)}"
                    raise DataProtoError(msg)
        batch = {k: torch.cat([d._batch[k] for d in data], dim=0) for k in first._batch}
        non_tensors = {
            k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0)
            for k in first.non_tensor_batch
        }
        return type(first)(batch=batch, non_tensor_batch=non_tensors, meta_info=_merge_meta(data))

    def chunk(self, chunks: int) -> list[Self]:
        """Split into ``chunks`` parts (views); len(self) must be divisible by ``chunks``.

        With padding enabled (:meth:`is_padding_enabled`) an uneven count is allowed: the
        first ``len % chunks`` parts get one row more (verl defers to TensorDict.chunk,
        which can return fewer than ``chunks`` parts; here there are always ``chunks``).
        """
        if not isinstance(chunks, int) or chunks < 1:
            msg = f"chunk needs a positive number of chunks, got {chunks!r}"
            raise DataProtoError(msg)
        n = len(self)
        if n % chunks and not self.is_padding_enabled():
            msg = (
                f"cannot chunk {n} rows into {chunks} equal parts; "
                "pad first with pad_dataproto_to_divisor(data, chunks)"
            )
            raise DataProtoError(msg)
        size, extra = divmod(n, chunks)
        bounds = [i * size + min(i, extra) for i in range(chunks + 1)]
        return [self.slice(bounds[i], bounds[i + 1]) for i in range(chunks)]

    def is_padding_enabled(self) -> bool:
        """True when this DataProto was built with ``auto_padding`` or
        ``DataProtoConfig.auto_padding`` is on (verl's semantics)."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or bool(
            DataProtoConfig.auto_padding
        )

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last row, in place."""
        if not isinstance(padding_size, int) or padding_size < 0:
            msg = f"padding_size must be a non-negative int, got {padding_size!r}"
            raise DataProtoError(msg)
        if padding_size == 0:
            return
        if len(self) == 0:
            msg = "padding: an empty DataProto has no row to repeat"
            raise DataProtoError(msg)
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = self.select_idxs(
            np.concatenate([np.arange(len(self)), np.full(padding_size, row)])
        )
        self._batch = padded._batch
        self.non_tensor_batch = padded.non_tensor_batch

    def split(self, split_size: int) -> list[Self]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        if not isinstance(split_size, int) or split_size < 1:
            msg = f"split needs a positive split_size, got {split_size!r}"
            raise DataProtoError(msg)
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> Self:
        """Repeat rows: interleaved (row i at rows i*k..i*k+k-1) or tiled (whole batch k times)."""
        return self._new(*repeat_rows(self._batch, self.non_tensor_batch, repeat_times, interleave))

    def sample_level_repeat(self, repeat_times: Sequence[int] | torch.Tensor | np.ndarray) -> Self:
        """Repeat row i ``repeat_times[i]`` times, in order (0 drops the row)."""
        if isinstance(repeat_times, torch.Tensor):
            repeat_times = repeat_times.detach().cpu().numpy()
        counts = np.asarray(repeat_times)
        if counts.ndim != 1 or (counts.size and not np.issubdtype(counts.dtype, np.integer)):
            msg = (
                "sample_level_repeat: repeat_times must be a 1-D sequence of ints, "
                f"got {counts.dtype} {counts.shape}"
            )
            raise DataProtoError(msg)
        if len(counts) != len(self) or (counts.size and counts.min() < 0):
            msg = (
                f"sample_level_repeat: need one non-negative count per row ({len(self)}), "
                f"got {len(counts)} counts"
            )
            raise DataProtoError(msg)
        return self.select_idxs(np.repeat(np.arange(len(self)), counts.astype(np.int64)))

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> Self:
        """Split dim 1 of each key in ``split_keys`` into ``n_split`` parts and move them to
        rows (row i becomes rows i*n_split .. i*n_split+n_split-1); other keys are repeated
        to match. With ``split_keys=None`` every key is repeated (as verl)."""
        columns = unfold_columns(self._batch, self.non_tensor_batch, n_split, split_keys)
        return self._new(*columns)

    def fold_batch_dim(self, new_batch_size: int) -> DataProto:
        """Rows ``(bsz, ...)`` -> ``(new_batch_size, bsz // new_batch_size, ...)``."""
        batch, non_tensors = fold_rows(
            self._batch, self.non_tensor_batch, len(self), new_batch_size
        )
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def unfold_batch_dim(self, batch_dims: int = 2) -> DataProto:
        """The first ``batch_dims`` dims of every entry become one row dim."""
        batch, non_tensors = unfold_rows(self._batch, self.non_tensor_batch, batch_dims)
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=self.meta_info)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute rows in place: row i becomes old row ``indices[i]``."""
        reordered = self.select_idxs(indices)
        self._batch = reordered._batch
        self.non_tensor_batch = reordered.non_tensor_batch

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[Self]:
        """Yield ``epochs`` passes of mini-batches of ``mini_batch_size`` rows, sharing meta_info.

        Rows come in order unless ``dataloader_kwargs={"shuffle": True}`` (verl's default,
        a torch DataLoader's); shuffled rows are redrawn every epoch from one generator seeded
        by ``seed`` (same seed, same order). ``dataloader_kwargs`` accepts only ``shuffle``
        (and ignores ``drop_last``).
        """
        kwargs = dict(dataloader_kwargs or {})
        shuffle = bool(kwargs.pop("shuffle", False))
        kwargs.pop("drop_last", None)  # irrelevant: the size must divide evenly
        if kwargs:
            msg = f"make_iterator: unsupported dataloader_kwargs {sorted(kwargs)} (only shuffle)"
            raise DataProtoError(msg)
        if not isinstance(mini_batch_size, int) or mini_batch_size < 1:
            msg = f"mini_batch_size must be a positive int, got {mini_batch_size!r}"
            raise DataProtoError(msg)
        n = len(self)
        if n % mini_batch_size:
            msg = f"{n} rows do not divide into mini-batches of {mini_batch_size}"
            raise DataProtoError(msg)
        generator = torch.Generator()
        if seed is not None:
            generator.manual_seed(seed)
        else:
            generator.seed()

        def batches() -> Iterator[Self]:
            for _ in range(epochs):
                order = torch.randperm(n, generator=generator).numpy() if shuffle else None
                for start in range(0, n, mini_batch_size):
                    if order is None:
                        part = self.slice(start, start + mini_batch_size)
                    else:
                        part = self.select_idxs(order[start : start + mini_batch_size])
                    part.meta_info = self.meta_info
                    yield part

        return batches()

    # --- devices, copies, pickling, files -------------------------------------------------------

    def to(self, device: str | torch.device, non_blocking: bool = False) -> Self:
        """Move every tensor to ``device`` in place; returns self."""
        self._batch = {k: v.to(device, non_blocking=non_blocking) for k, v in self._batch.items()}
        return self

    def __copy__(self) -> Self:
        new = type(self).__new__(type(self))
        new._batch = dict(self._batch)
        new.non_tensor_batch = dict(self.non_tensor_batch)
        new.meta_info = dict(self.meta_info)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new._batch = {k: v.clone() for k, v in self._batch.items()}
        new.non_tensor_batch = copy.deepcopy(self.non_tensor_batch, memo)
        new.meta_info = copy.deepcopy(self.meta_info, memo)
        return new

    def __getstate__(self) -> dict[str, Any]:
        # Tensors as numpy arrays: Ray sends those as out-of-band buffers. Tensors come back
        # on CPU whatever device they left from; workers move them with .to(device).
        return {
            "batch": {k: tensor_to_numpy(v) for k, v in self._batch.items()},
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._batch = {k: numpy_to_tensor(arr, dt) for k, (arr, dt) in state["batch"].items()}
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Write a file that :meth:`load_from_disk` reads without unpickling arbitrary objects.

        Tensors are saved on CPU. Non-tensor values and meta_info may hold numbers, str, bytes,
        None, numpy arrays and scalars, lists, tuples and dicts; anything else raises here.
        """
        save_file(filepath, self._batch, self.non_tensor_batch, self.meta_info)

    @classmethod
    def load_from_disk(cls, filepath: str | os.PathLike[str]) -> Self:
        """Read a file written by :meth:`save_to_disk` (``torch.load(weights_only=True)``)."""
        batch, non_tensors, meta_info = load_file(filepath)
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    # --- internals -----------------------------------------------------------------------

    def _new(self, batch: dict[str, torch.Tensor], non_tensors: dict[str, np.ndarray]) -> Self:
        # Derived rows of a consistent DataProto are consistent: skip the checks.
        new = type(self).__new__(type(self))
        new._batch = batch
        new.non_tensor_batch = non_tensors
        new.meta_info = dict(self.meta_info)
        return new
