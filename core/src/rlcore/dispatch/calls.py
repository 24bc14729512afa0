"""One group call as dispatch and collect functions see it, a rank's place in its mesh, and the
pending result of a non-blocking call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs

from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    pass


DEFAULT_MESH = "default"
ArgLists = tuple[tuple[list[Any], ...], dict[str, list[Any]]]


class DispatchError(RlcoreError, ValueError):
    """A group call's arguments do not fit its dispatch mode, or the mode is unknown."""


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
