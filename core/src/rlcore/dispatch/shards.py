"""How a group call's arguments are split into one list per rank, and how the ranks' outputs are
gathered back (the functions behind the built-in dispatch modes)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlcore.dispatch.calls import (
    ArgLists,
    CollectFn,
    DispatchCall,
    DispatchError,
    DispatchFn,
    DispatchInfo,
    GroupFuture,
    ShardsFn,
)

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)


# --- splitting helpers ----------------------------------------------------------------------


def _is_proto(x: object) -> bool:
    from rlcore.protocol import DataProto

    return isinstance(x, DataProto)


def split_dataproto_args(
    call: DispatchCall, chunks: int, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> ArgLists:
    """Split every DataProto argument into ``chunks`` parts; repeat every other argument.

    Uneven batches are padded (rows repeated from the start) to a multiple of ``chunks`` and
    ``call.pad_size`` records how many rows to drop from the collected result. A
    :class:`GroupFuture` whose shards already number ``chunks`` is passed shard by shard (the
    ObjectRefs go straight to the workers); any other future is resolved here first.
    """
    from rlcore.protocol import pad_dataproto_to_divisor

    values: list[tuple[str | int, Any]] = [*enumerate(args), *kwargs.items()]
    futures = [v for _, v in values if isinstance(v, GroupFuture)]
    concrete = [v for _, v in values if _is_proto(v)]
    # Refs only when every data argument is a future with the same layout; mixing a shard
    # layout with a freshly padded DataProto could disagree on padding.
    use_refs = (
        bool(futures)
        and not concrete
        and all(f.chainable("proto", chunks) for f in futures)
        and len({f.pad_size for f in futures}) == 1
    )
    resolved: list[tuple[str | int, Any]] = []
    for key, v in values:
        if isinstance(v, GroupFuture) and not use_refs:
            log.debug("%s: resolving a future on the driver (layout differs)", call.method)
            v = v.get()
        resolved.append((key, v))

    lengths = {len(v) for _, v in resolved if _is_proto(v)}
    if len(lengths) > 1:
        msg = (
            f"{call.method}: DataProto arguments must have the same length to be split "
            f"together, got lengths {sorted(lengths)}"
        )
        raise DispatchError(msg)
    call.pad_size = futures[0].pad_size if use_refs else 0

    def split(v: Any) -> list[Any]:
        if isinstance(v, GroupFuture):
            assert v.shards is not None  # checked by chainable()
            return list(v.shards)
        if _is_proto(v):
            padded, pad = pad_dataproto_to_divisor(v, chunks)
            call.pad_size = pad
            return list(padded.chunk(chunks))
        return [v] * chunks

    out_args = tuple(split(v) for k, v in resolved if isinstance(k, int))
    out_kwargs = {k: split(v) for k, v in resolved if isinstance(k, str)}
    return out_args, out_kwargs


def _lists_of(
    call: DispatchCall, n: int, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> ArgLists:
    """Arguments given as lists of ``n`` items (or futures of ``n`` per-rank items)."""

    def check(name: str, v: Any) -> list[Any]:
        if isinstance(v, GroupFuture):
            if v.chainable("list", n) and v.shards is not None:
                return list(v.shards)
            v = v.get()
        if not isinstance(v, list | tuple) or len(v) != n:
            got = (
                f"{type(v).__name__} of length {len(v)}"
                if isinstance(v, list | tuple)
                else type(v).__name__
            )
            msg = (
                f"{call.method}: argument {name} must be a list of {n} items "
                f"(one per rank), got {got}"
            )
            raise DispatchError(msg)
        return list(v)

    return (
        tuple(check(f"#{i}", v) for i, v in enumerate(args)),
        {k: check(k, v) for k, v in kwargs.items()},
    )


def _expand_to_ranks(infos: list[DispatchInfo], lists: ArgLists) -> ArgLists:
    """Per-dp-rank lists -> per-rank lists: each rank gets its data-parallel group's item."""
    args, kwargs = lists
    return (
        tuple([a[info.dp_rank] for info in infos] for a in args),
        {k: [v[info.dp_rank] for info in infos] for k, v in kwargs.items()},
    )


def _collect_ranks(infos: list[DispatchInfo], outputs: list[Any]) -> list[Any]:
    """Outputs of the collect ranks, ordered by data-parallel rank."""
    chosen = sorted((info.dp_rank, i) for i, info in enumerate(infos) if info.is_collect)
    return [outputs[i] for _, i in chosen]


def concat_unpad(call: DispatchCall, outputs: list[Any]) -> DataProto:
    from rlcore.protocol import DataProto, unpad_dataproto

    for rank, o in enumerate(outputs):
        if not isinstance(o, DataProto):
            msg = (
                f"{call.method}: a DataProto dispatch mode expects every shard's output to be a "
                f"DataProto, shard {rank} returned {type(o).__name__}"
            )
            raise DispatchError(msg)
    return unpad_dataproto(DataProto.concat(outputs), call.pad_size)


# --- built-in modes -------------------------------------------------------------------------


def one_to_all(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    n = call.world_size
    resolved = [a.get() if isinstance(a, GroupFuture) else a for a in args]
    kw = {k: v.get() if isinstance(v, GroupFuture) else v for k, v in kwargs.items()}
    return tuple([a] * n for a in resolved), {k: [v] * n for k, v in kw.items()}


def all_to_all(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    return _lists_of(call, call.world_size, args, kwargs)


def as_list(call: DispatchCall, outputs: list[Any]) -> list[Any]:
    return list(outputs)


def all_shards(call: DispatchCall, refs: list[Any]) -> list[Any] | None:
    return list(refs)


def dp_proto(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    return split_dataproto_args(call, call.world_size, args, kwargs)


def dp_proto_with_func(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    if not args or not callable(args[0]):
        msg = f"{call.method}: DP_COMPUTE_PROTO_WITH_FUNC needs a function as first argument"
        raise DispatchError(msg)
    split_args, split_kwargs = split_dataproto_args(call, call.world_size, args[1:], kwargs)
    return ([args[0]] * call.world_size, *split_args), split_kwargs


def mesh_modes(mesh: str) -> tuple[DispatchFn, DispatchFn, CollectFn, CollectFn, ShardsFn]:
    def dispatch_proto(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
        infos = call.group.dispatch_info(mesh)
        dp_size = infos[0].dp_size
        return _expand_to_ranks(infos, split_dataproto_args(call, dp_size, args, kwargs))

    def dispatch_lists(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
        infos = call.group.dispatch_info(mesh)
        return _expand_to_ranks(infos, _lists_of(call, infos[0].dp_size, args, kwargs))

    def collect_proto(call: DispatchCall, outputs: list[Any]) -> Any:
        return concat_unpad(call, _collect_ranks(call.group.dispatch_info(mesh), outputs))

    def collect_lists(call: DispatchCall, outputs: list[Any]) -> Any:
        return _collect_ranks(call.group.dispatch_info(mesh), outputs)

    def shards(call: DispatchCall, refs: list[Any]) -> list[Any] | None:
        return _collect_ranks(call.group.dispatch_info(mesh), refs)

    return dispatch_proto, dispatch_lists, collect_proto, collect_lists, shards
