"""How one driver call becomes one call per worker rank, and how the answers come back.

Public API
----------
``register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.ALL, blocking=True)``
    Marks a worker method; a worker group builds a proxy method of the same name from it::

        class ActorWorker(Worker):
            @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
            def compute_log_prob(self, data: DataProto) -> DataProto: ...

        wg.compute_log_prob(batch)   # split batch by rank, call every rank, concat, unpad

``Dispatch`` (members are ``str``, so a mode is also addressable by its name; extendable by
name as verl's, ``Dispatch.register("MY_MODE")``):

============================ ===================================================================
``ONE_TO_ALL``               every rank gets every argument; result: list of per-rank outputs
``ALL_TO_ALL``               each argument is already a list, one item per rank; result: list
``DP_COMPUTE``               same as ``ALL_TO_ALL`` but checks every list has world-size items
``DP_COMPUTE_PROTO``         DataProto arguments are padded to a multiple of the world size and
                             chunked, one chunk per rank; other arguments go to every rank; the
                             per-rank DataProto outputs are concatenated and the padding removed
``DP_COMPUTE_PROTO_WITH_FUNC`` the first argument is a function sent to every rank, the rest as
                             ``DP_COMPUTE_PROTO``
``DP_COMPUTE_METRIC``        split as ``DP_COMPUTE_PROTO``; result: list of per-rank outputs
``MESH_COMPUTE_PROTO``       for engines whose ranks are not all data-parallel (tensor/pipeline
                             parallel): the DataProto is split by data-parallel rank, every rank
                             of a data-parallel group gets the same chunk, and only the one
                             "collect" rank per group returns data. ``mesh_dispatch_mode("x")``
                             makes the same mode for a named mesh (a worker holding two engines
                             with different meshes, e.g. the actor and the rollout).
``MESH_COMPUTE``             the same with arguments given as lists of data-parallel-size items
============================ ===================================================================

A worker states its place in a mesh with ``Worker.set_dispatch_info(dp_rank=..., dp_size=...,
is_collect=..., mesh=...)``; a worker that never does is its own data-parallel group.

``Execute.ALL`` calls every rank; ``Execute.RANK_ZERO`` calls only rank 0 (with rank 0's share of
the dispatched arguments) and returns its output as is.

Custom modes: ``register_dispatch_mode(name, dispatch_fn, collect_fn)`` (or, as verl,
``register(dispatch_mode={"dispatch_fn": f, "collect_fn": g})``) with
``dispatch_fn(call, *args, **kwargs) -> (args_lists, kwargs_lists)`` (each a list with one item
per rank) and ``collect_fn(call, outputs) -> result`` where ``call`` is a :class:`DispatchCall`.
``register(dispatch_mode="NAME")`` (or ``Dispatch.NAME``: registering adds the member) then
selects it. ``split_dataproto_args`` is the helper the
built-in DataProto modes use; custom modes may reuse it.

Non-blocking calls (``blocking=False``) return a :class:`GroupFuture` without waiting. Passed as
an argument to the next group call, a future whose shards line up with that call's split (same
number of data-parallel shards) hands each rank its own Ray ObjectRef, which Ray resolves in the
worker: the data never travels through the driver. Otherwise the future is resolved on the
driver first. ``future.get()`` waits and collects.

Differences from verl: ``Dispatch`` members are strings, not ``DynamicEnum`` objects with
integer values; verl's ``Dispatch.RANK_ZERO`` and ``DIRECT_ROLLOUT_METHOD`` are not modes here
(use ``Execute.RANK_ZERO``). Custom dispatch and collect functions get a :class:`DispatchCall`
where verl passes the worker group; it has ``world_size`` (and ``group``), so verl functions
that read ``worker_group.world_size`` port unchanged.

Nothing here imports torch or Ray at module import time.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import attrs

from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = [
    "DISPATCH_ATTR",
    "Dispatch",
    "DispatchCall",
    "DispatchError",
    "DispatchInfo",
    "DispatchMode",
    "DispatchName",
    "Execute",
    "GroupFuture",
    "MethodSpec",
    "get_dispatch_mode",
    "get_method_spec",
    "mesh_dispatch_mode",
    "register",
    "register_dispatch_mode",
    "split_dataproto_args",
]

# Attribute set on a registered function; a worker group looks for it along the class MRO.
DISPATCH_ATTR = "_rlcore_dispatch"

DEFAULT_MESH = "default"

F = TypeVar("F", bound=Callable[..., Any])
ArgLists = tuple[tuple[list[Any], ...], dict[str, list[Any]]]


class DispatchError(RlcoreError, ValueError):
    """A group call's arguments do not fit its dispatch mode, or the mode is unknown."""


class DispatchName(str):
    """One member of :class:`Dispatch`: a ``str`` (its name) with enum-like ``name``/``value``."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return str.__str__(self)

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<Dispatch.{str.__str__(self)}>"


class _DispatchMeta(type):
    """Enum-like access to :class:`Dispatch`: ``"X" in Dispatch``, ``Dispatch["X"]``, iteration."""

    _members: dict[str, DispatchName]

    def __iter__(cls) -> Iterator[DispatchName]:
        return iter(list(cls._members.values()))

    def __contains__(cls, item: object) -> bool:
        return isinstance(item, str) and str(item) in cls._members

    def __getitem__(cls, name: str) -> DispatchName:
        try:
            return cls._members[name]
        except KeyError:
            msg = f"Dispatch has no mode {name!r}; modes: {', '.join(cls._members)}"
            raise KeyError(msg) from None

    def __len__(cls) -> int:
        return len(cls._members)


class Dispatch(metaclass=_DispatchMeta):
    """The dispatch modes by name, extendable as verl's ``Dispatch`` (a ``DynamicEnum``).

    ``Dispatch.register("MY_MODE")`` adds ``Dispatch.MY_MODE`` (names are upper-cased, and a
    name registered twice raises, as in verl); give it functions with
    :func:`register_dispatch_mode`, which also adds the member when it is new. Members are
    ``str`` subclasses, so ``Dispatch.DP_COMPUTE_PROTO == "DP_COMPUTE_PROTO"``. Mesh modes of
    named meshes (``"MESH_COMPUTE_PROTO[rollout]"``) are members reachable with ``Dispatch[...]``.
    """

    _members: dict[str, DispatchName] = {}  # noqa: RUF012 - the registry, shared on purpose

    ONE_TO_ALL = DispatchName("ONE_TO_ALL")
    ALL_TO_ALL = DispatchName("ALL_TO_ALL")
    DP_COMPUTE = DispatchName("DP_COMPUTE")
    DP_COMPUTE_PROTO = DispatchName("DP_COMPUTE_PROTO")
    DP_COMPUTE_PROTO_WITH_FUNC = DispatchName("DP_COMPUTE_PROTO_WITH_FUNC")
    DP_COMPUTE_METRIC = DispatchName("DP_COMPUTE_METRIC")
    MESH_COMPUTE = DispatchName("MESH_COMPUTE")
    MESH_COMPUTE_PROTO = DispatchName("MESH_COMPUTE_PROTO")

    @classmethod
    def register(cls, name: str) -> DispatchName:
        """Add a mode name (upper-cased, as verl); raises ``DispatchError`` if it exists."""
        key = str(name).upper()
        if key in cls._members:
            msg = f"dispatch mode {key} already registered"
            raise DispatchError(msg)
        return cls._add(key)

    @classmethod
    def remove(cls, name: str) -> DispatchName:
        """Drop a mode name (and its functions, if any); as verl's ``Dispatch.remove``."""
        key = str(name).upper() if str(name).upper() in cls._members else str(name)
        member = cls[key]
        del cls._members[key]
        _REGISTRY.pop(key, None)
        if key.isidentifier() and key in cls.__dict__:
            delattr(cls, key)
        return member

    @classmethod
    def from_name(cls, name: str) -> DispatchName | None:
        return cls._members.get(str(name)) or cls._members.get(str(name).upper())

    @classmethod
    def names(cls) -> list[str]:
        return list(cls._members)

    @classmethod
    def _add(cls, key: str) -> DispatchName:
        member = cls._members.get(key) or DispatchName(key)
        cls._members[key] = member
        if key.isidentifier():
            setattr(cls, key, member)
        return member


for _name, _member in list(vars(Dispatch).items()):
    if isinstance(_member, DispatchName):
        Dispatch._members[_name] = _member


class Execute(enum.StrEnum):
    """Which ranks run a call: all of them, or rank 0 alone."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"


@attrs.frozen(kw_only=True)
class MethodSpec:
    """What ``register`` stored on a worker method."""

    dispatch_mode: str
    execute_mode: Execute = Execute.ALL
    blocking: bool = True


@attrs.frozen(kw_only=True)
class DispatchInfo:
    """A rank's place in a data-parallel mesh, as the worker reported it."""

    dp_rank: int
    dp_size: int
    # True on the one rank per data-parallel group whose output is kept (e.g. tp 0, last pp).
    is_collect: bool = True


class GroupLike(Protocol):
    """What dispatch functions may ask of a worker group."""

    @property
    def world_size(self) -> int: ...

    def dispatch_info(self, mesh: str = DEFAULT_MESH) -> list[DispatchInfo]: ...


@attrs.define(kw_only=True)
class DispatchCall:
    """One group call, as seen by dispatch and collect functions.

    ``pad_size`` is set by a dispatch function that padded its DataProto arguments and read by
    the collect function that removes the padding again.
    """

    group: GroupLike
    method: str
    pad_size: int = 0

    @property
    def world_size(self) -> int:
        return self.group.world_size


DispatchFn = Callable[..., ArgLists]
CollectFn = Callable[[DispatchCall, list[Any]], Any]
# From the per-rank ObjectRefs of a non-blocking call, the ordered data shards whose
# concatenation is the result (before unpadding), or None when the result is not shardable.
ShardsFn = Callable[[DispatchCall, list[Any]], list[Any] | None]
ShardKind = Literal["proto", "list"]


@attrs.frozen(kw_only=True)
class DispatchMode:
    """A registered mode: how to split arguments and how to gather outputs."""

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    shards_fn: ShardsFn | None = None
    # "proto": shards are DataProto chunks (concat + unpad); "list": per-rank items.
    shard_kind: ShardKind | None = None


_REGISTRY: dict[str, DispatchMode] = {}


def register_dispatch_mode(
    name: str,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn,
    *,
    shards_fn: ShardsFn | None = None,
    shard_kind: ShardKind | None = None,
    replace: bool = False,
) -> str:
    """Add a custom dispatch mode; returns ``name`` for use in ``register(dispatch_mode=...)``.

    ``shards_fn``/``shard_kind`` (optional) let non-blocking results of this mode be chained
    into the next call without a driver round trip (see :class:`GroupFuture`).
    """
    # Upper-cased as verl's Dispatch.register does, so register_dispatch_mode("my_mode", ...)
    # gives Dispatch.MY_MODE; derived names such as "MESH_COMPUTE_PROTO[rollout]" stay as given.
    name = str(name).upper() if str(name).isidentifier() else str(name)
    if name in _REGISTRY and not replace:
        msg = f"dispatch mode {name!r} is already registered; pass replace=True to override it"
        raise DispatchError(msg)
    Dispatch._add(name)
    _REGISTRY[name] = DispatchMode(
        name=name,
        dispatch_fn=dispatch_fn,
        collect_fn=collect_fn,
        shards_fn=shards_fn,
        shard_kind=shard_kind,
    )
    return Dispatch[name]


def get_dispatch_mode(name: str) -> DispatchMode:
    try:
        return _REGISTRY[str(name)]
    except KeyError:
        if str(name).upper() in _REGISTRY:
            return _REGISTRY[str(name).upper()]
        declared = " (declared with Dispatch.register but given no functions)"
        msg = (
            f"unknown dispatch mode {str(name)!r}{declared if str(name) in Dispatch else ''}; "
            f"registered: {', '.join(sorted(_REGISTRY))}. "
            "Add custom modes with rlcore.dispatch.register_dispatch_mode"
        )
        raise DispatchError(msg) from None


def register(
    dispatch_mode: str | Mapping[str, Callable[..., Any]] = Dispatch.ALL_TO_ALL,
    execute_mode: Execute | str = Execute.ALL,
    *,
    blocking: bool = True,
) -> Callable[[F], F]:
    """Mark a worker method for a worker group proxy. The function itself is unchanged.

    ``dispatch_mode`` is a mode name or, as in verl, a dict ``{"dispatch_fn": ...,
    "collect_fn": ...}``: that pair is registered under a name derived from the dispatch
    function (``CUSTOM[module.qualname]``), the same in the driver and in every worker.
    """
    try:
        execute = Execute(str(execute_mode))
    except ValueError:
        msg = f"unknown execute mode {execute_mode!r}; use one of {[e.value for e in Execute]}"
        raise DispatchError(msg) from None
    if isinstance(dispatch_mode, Mapping):
        dispatch_mode = _register_inline_mode(dispatch_mode)
    spec = MethodSpec(dispatch_mode=str(dispatch_mode), execute_mode=execute, blocking=blocking)

    def decorate(fn: F) -> F:
        # Stored, not wrapped: the method behaves the same when called inside the worker.
        setattr(fn, DISPATCH_ATTR, spec)
        return fn

    return decorate


def _register_inline_mode(fns: Mapping[str, Callable[..., Any]]) -> str:
    missing = [k for k in ("dispatch_fn", "collect_fn") if not callable(fns.get(k))]
    if missing:
        msg = f"register: a dict dispatch_mode needs callables under {missing}"
        raise DispatchError(msg)
    dispatch_fn, collect_fn = fns["dispatch_fn"], fns["collect_fn"]
    name = f"CUSTOM[{dispatch_fn.__module__}.{dispatch_fn.__qualname__}]"
    existing = _REGISTRY.get(name)
    if existing is not None and (
        existing.dispatch_fn is not dispatch_fn or existing.collect_fn is not collect_fn
    ):
        # Re-registering the same pair (a module imported twice) is fine; a different pair under
        # the same function name would silently change another method's dispatch.
        msg = f"register: dispatch function {name[7:-1]} is already used with another collect_fn"
        raise DispatchError(msg)
    return register_dispatch_mode(name, dispatch_fn, collect_fn, replace=True)


def get_method_spec(fn: object) -> MethodSpec | None:
    spec = getattr(fn, DISPATCH_ATTR, None)
    return spec if isinstance(spec, MethodSpec) else None


# --- futures ------------------------------------------------------------------------------


@attrs.define(kw_only=True, eq=False, slots=False)
class GroupFuture:
    """The pending result of a non-blocking group call.

    ``refs`` holds one Ray ObjectRef per called rank; ``shards`` (when the mode allows) the
    ordered data shards, ``pad_size`` the padding rows at the end of the last shards.
    """

    refs: list[Any]
    _resolve: Callable[[list[Any]], list[Any]]
    _collect: Callable[[list[Any]], Any]
    shards: list[Any] | None = None
    shard_kind: ShardKind | None = None
    pad_size: int = 0
    _done: bool = attrs.field(default=False, init=False)
    _value: Any = attrs.field(default=None, init=False)

    def get(self) -> Any:
        """Wait for every rank and return the collected result (cached after the first call)."""
        if not self._done:
            self._value = self._collect(self._resolve(self.refs))
            self._done = True
        return self._value

    def chainable(self, kind: ShardKind, n_shards: int) -> bool:
        return self.shard_kind == kind and self.shards is not None and len(self.shards) == n_shards

    def __repr__(self) -> str:
        n = None if self.shards is None else len(self.shards)
        return f"GroupFuture(ranks={len(self.refs)}, shards={n}, kind={self.shard_kind})"


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


def _concat_unpad(call: DispatchCall, outputs: list[Any]) -> DataProto:
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


def _one_to_all(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    n = call.world_size
    resolved = [a.get() if isinstance(a, GroupFuture) else a for a in args]
    kw = {k: v.get() if isinstance(v, GroupFuture) else v for k, v in kwargs.items()}
    return tuple([a] * n for a in resolved), {k: [v] * n for k, v in kw.items()}


def _all_to_all(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    return _lists_of(call, call.world_size, args, kwargs)


def _as_list(call: DispatchCall, outputs: list[Any]) -> list[Any]:
    return list(outputs)


def _all_shards(call: DispatchCall, refs: list[Any]) -> list[Any] | None:
    return list(refs)


def _dp_proto(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    return split_dataproto_args(call, call.world_size, args, kwargs)


def _dp_proto_with_func(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
    if not args or not callable(args[0]):
        msg = f"{call.method}: DP_COMPUTE_PROTO_WITH_FUNC needs a function as first argument"
        raise DispatchError(msg)
    split_args, split_kwargs = split_dataproto_args(call, call.world_size, args[1:], kwargs)
    return ([args[0]] * call.world_size, *split_args), split_kwargs


def _mesh_modes(mesh: str) -> tuple[DispatchFn, DispatchFn, CollectFn, CollectFn, ShardsFn]:
    def dispatch_proto(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
        infos = call.group.dispatch_info(mesh)
        dp_size = infos[0].dp_size
        return _expand_to_ranks(infos, split_dataproto_args(call, dp_size, args, kwargs))

    def dispatch_lists(call: DispatchCall, *args: Any, **kwargs: Any) -> ArgLists:
        infos = call.group.dispatch_info(mesh)
        return _expand_to_ranks(infos, _lists_of(call, infos[0].dp_size, args, kwargs))

    def collect_proto(call: DispatchCall, outputs: list[Any]) -> Any:
        return _concat_unpad(call, _collect_ranks(call.group.dispatch_info(mesh), outputs))

    def collect_lists(call: DispatchCall, outputs: list[Any]) -> Any:
        return _collect_ranks(call.group.dispatch_info(mesh), outputs)

    def shards(call: DispatchCall, refs: list[Any]) -> list[Any] | None:
        return _collect_ranks(call.group.dispatch_info(mesh), refs)

    return dispatch_proto, dispatch_lists, collect_proto, collect_lists, shards


def mesh_dispatch_mode(mesh: str, *, proto: bool = True) -> str:
    """The name of the mesh-aware mode for ``mesh`` (registered on first use).

    ``mesh_dispatch_mode("default")`` is ``Dispatch.MESH_COMPUTE_PROTO`` (``proto=False``:
    ``Dispatch.MESH_COMPUTE``). Workers report their place in ``mesh`` with
    ``Worker.set_dispatch_info(..., mesh=mesh)``.
    """
    if mesh == DEFAULT_MESH:
        return Dispatch.MESH_COMPUTE_PROTO if proto else Dispatch.MESH_COMPUTE
    name = f"{'MESH_COMPUTE_PROTO' if proto else 'MESH_COMPUTE'}[{mesh}]"
    if name not in _REGISTRY:
        _register_mesh(mesh, f"MESH_COMPUTE_PROTO[{mesh}]", f"MESH_COMPUTE[{mesh}]")
    return name


def _register_mesh(mesh: str, proto_name: str, list_name: str) -> None:
    d_proto, d_lists, c_proto, c_lists, shards = _mesh_modes(mesh)
    register_dispatch_mode(
        proto_name, d_proto, c_proto, shards_fn=shards, shard_kind="proto", replace=True
    )
    register_dispatch_mode(
        list_name, d_lists, c_lists, shards_fn=shards, shard_kind="list", replace=True
    )


def _register_builtins() -> None:
    reg = register_dispatch_mode
    reg(Dispatch.ONE_TO_ALL, _one_to_all, _as_list, shards_fn=_all_shards, shard_kind="list")
    reg(Dispatch.ALL_TO_ALL, _all_to_all, _as_list, shards_fn=_all_shards, shard_kind="list")
    reg(Dispatch.DP_COMPUTE, _all_to_all, _as_list, shards_fn=_all_shards, shard_kind="list")
    reg(
        Dispatch.DP_COMPUTE_PROTO,
        _dp_proto,
        _concat_unpad,
        shards_fn=_all_shards,
        shard_kind="proto",
    )
    reg(
        Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
        _dp_proto_with_func,
        _concat_unpad,
        shards_fn=_all_shards,
        shard_kind="proto",
    )
    reg(Dispatch.DP_COMPUTE_METRIC, _dp_proto, _as_list, shards_fn=_all_shards, shard_kind="list")
    _register_mesh(DEFAULT_MESH, Dispatch.MESH_COMPUTE_PROTO, Dispatch.MESH_COMPUTE)


_register_builtins()
