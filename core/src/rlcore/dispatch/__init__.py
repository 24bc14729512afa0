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
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs

from rlcore.dispatch.calls import DEFAULT_MESH as DEFAULT_MESH
from rlcore.dispatch.calls import (
    CollectFn,
    DispatchCall,
    DispatchError,
    DispatchFn,
    DispatchInfo,
    GroupFuture,
    ShardKind,
    ShardsFn,
)
from rlcore.dispatch.shards import (
    all_shards,
    all_to_all,
    as_list,
    concat_unpad,
    dp_proto,
    dp_proto_with_func,
    mesh_modes,
    one_to_all,
    split_dataproto_args,
)

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

F = TypeVar("F", bound=Callable[..., Any])


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
    d_proto, d_lists, c_proto, c_lists, shards = mesh_modes(mesh)
    register_dispatch_mode(
        proto_name, d_proto, c_proto, shards_fn=shards, shard_kind="proto", replace=True
    )
    register_dispatch_mode(
        list_name, d_lists, c_lists, shards_fn=shards, shard_kind="list", replace=True
    )


def _register_builtins() -> None:
    reg = register_dispatch_mode
    reg(Dispatch.ONE_TO_ALL, one_to_all, as_list, shards_fn=all_shards, shard_kind="list")
    reg(Dispatch.ALL_TO_ALL, all_to_all, as_list, shards_fn=all_shards, shard_kind="list")
    reg(Dispatch.DP_COMPUTE, all_to_all, as_list, shards_fn=all_shards, shard_kind="list")
    reg(
        Dispatch.DP_COMPUTE_PROTO,
        dp_proto,
        concat_unpad,
        shards_fn=all_shards,
        shard_kind="proto",
    )
    reg(
        Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
        dp_proto_with_func,
        concat_unpad,
        shards_fn=all_shards,
        shard_kind="proto",
    )
    reg(Dispatch.DP_COMPUTE_METRIC, dp_proto, as_list, shards_fn=all_shards, shard_kind="list")
    _register_mesh(DEFAULT_MESH, Dispatch.MESH_COMPUTE_PROTO, Dispatch.MESH_COMPUTE)


_register_builtins()
