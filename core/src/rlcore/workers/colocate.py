"""Several roles in one process: one process per device holding actor, rollout and reference.

``create_colocated_worker_cls({"actor": ClassWithInitArgs(ActorWorker, cfg), "ref": ...})``
returns a ``ClassWithInitArgs`` for :class:`ColocatedWorker`, whose instance builds one instance
of each role class in the same process (in the order given, so put the rollout last when it
sizes its cache from free memory). A ``RayWorkerGroup`` over it exposes every registered method
of every role as ``<role>_<method>`` and ``wg.spawn()`` gives a per-role view with the role's
methods under their own names::

    wg = RayWorkerGroup(pool, create_colocated_worker_cls({"actor": a, "ref": r}), role="fused")
    views = wg.spawn()
    views["actor"].update_actor(batch)      # same as wg.actor_update_actor(batch)

Registered role methods may be ``async def``: when any role has one, the process class is
:class:`AsyncColocatedWorker` (a Ray async actor, as a group of that role alone would be) and
the group calls those methods through ``rlcore_call_role_async``, which awaits them on the
actor's event loop.

The class is a fixed class of this module (not one built at run time), so Ray pickles it by
reference and imports the role classes by reference in the worker.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from rlcore.dispatch import DEFAULT_MESH, DispatchInfo, get_method_spec
from rlcore.workers.worker import Worker

__all__ = [
    "AsyncColocatedWorker",
    "ClassWithInitArgs",
    "ColocatedWorker",
    "create_colocated_worker_cls",
]


class ClassWithInitArgs:
    """A worker class and the arguments its instances are built with.

    ``ClassWithInitArgs(ActorWorker, config, seed=1)``.
    """

    def __init__(self, cls: type[Any], *args: Any, **kwargs: Any) -> None:
        self.cls = cls
        self.args = tuple(args)
        self.kwargs = dict(kwargs)

    def __repr__(self) -> str:
        name = self.cls.__qualname__
        return f"ClassWithInitArgs({name}, args={len(self.args)}, kwargs={sorted(self.kwargs)})"

    def build(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class ColocatedWorker(Worker):
    """Holds one instance per role in this process; calls are routed by role name."""

    def __init__(self, roles: Mapping[str, ClassWithInitArgs]) -> None:
        super().__init__()
        self.roles: dict[str, Any] = {}
        for name, spec in roles.items():
            self.roles[name] = spec.build()

    def rlcore_call_role(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.roles[role], method)(*args, **kwargs)

    def rlcore_role_dispatch_info(self, role: str, mesh: str = DEFAULT_MESH) -> DispatchInfo | None:
        inst = self.roles[role]
        return inst.rlcore_dispatch_info(mesh) if isinstance(inst, Worker) else None


class AsyncColocatedWorker(ColocatedWorker):
    """A :class:`ColocatedWorker` whose roles have ``async def`` methods: it awaits them."""

    async def rlcore_call_role_async(
        self, role: str, method: str, *args: Any, **kwargs: Any
    ) -> Any:
        result = getattr(self.roles[role], method)(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


def _has_async_methods(cls: type[Any]) -> bool:
    """Whether a registered method of ``cls`` is ``async def`` (only those are called from the
    driver, so only they make the process an async actor)."""
    for name in dir(cls):
        fn = getattr(cls, name, None)
        if get_method_spec(fn) is not None and inspect.iscoroutinefunction(fn):
            return True
    return False


def create_colocated_worker_cls(roles: Mapping[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """One process class holding every role in ``roles`` (see the module docstring)."""
    if not roles:
        msg = "create_colocated_worker_cls needs at least one role"
        raise ValueError(msg)
    for name, spec in roles.items():
        if not name.isidentifier():
            msg = f"role name {name!r} must be a Python identifier (it prefixes method names)"
            raise ValueError(msg)
        if not isinstance(spec, ClassWithInitArgs):
            msg = f"role {name!r}: expected ClassWithInitArgs, got {type(spec).__name__}"
            raise TypeError(msg)
    any_async = any(_has_async_methods(spec.cls) for spec in roles.values())
    return ClassWithInitArgs(AsyncColocatedWorker if any_async else ColocatedWorker, dict(roles))
