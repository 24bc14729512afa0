"""A driver-side proxy over a group of Ray actors: one call becomes split -> RPC -> gather.

``RayWorkerGroup(resource_pool, ClassWithInitArgs(MyWorker, cfg), role="actor")`` places one
actor per slot of the pool (``ray.remote`` is applied here, to an undecorated ``Worker``
subclass), with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` in each
actor's environment and torch pinned to the actor's CPU share. Every method marked with
``rlcore.dispatch.register`` (looked up along the class MRO) becomes a method of the group::

    wg = RayWorkerGroup(pool, ClassWithInitArgs(ActorWorker, cfg), role="actor")
    out = wg.compute_log_prob(batch)          # DataProto in, DataProto out
    fut = wg.generate(batch)                  # registered with blocking=False -> GroupFuture
    out = wg.compute_log_prob(fut)            # chunks go worker to worker, not via the driver

A failure in a worker reaches the driver as one ``WorkerError`` whose first line reads
``role actor rank 1 failed in compute_log_prob: ValueError: ...`` followed by the remote
traceback; an :class:`~rlcore.errors.RlcoreError` raised in a worker (what only the worker can
check, named by its key) stays one line, ``role actor rank 1 failed in init_model: <its
message>``; a dead actor gives ``role actor rank 1 (node 10.0.0.2, pid 123) died in ...``.

For colocated roles (``create_colocated_worker_cls``), methods appear as ``<role>_<method>``
and ``wg.spawn()`` returns ``{role: view}`` with each role's methods under their own names.

Other helpers: ``execute_all(name, *args)`` (call any method on every rank, same arguments),
``execute_rank(rank, name, *args)``, ``process_info`` (pid and node per rank), ``shutdown()``.

Several groups may share one pool (up to its ``max_colocate_count``, each actor taking that
fraction of its bundle), e.g. an actor group and a critic group side by side; see
:mod:`rlcore.workers.resources`.

No wait is unbounded. Actor start (placement in the pool's bundles and ``__init__``) is bounded
by ``start_timeout_s`` (600 s, a run's ``resources.start_timeout_s``), every call (and
``GroupFuture.get()``) by ``call_timeout_s`` (3600 s, ``resources.call_timeout_s``); on expiry a
``WorkerTimeoutError`` names the group, the ranks still pending and what they were doing::

    role critic: ranks [0] did not start within 2 s (resources.start_timeout_s): not placed in
    pool 'global_pool' bundles [0, 1] (its resources are held by others); ...
    role actor: method hang on ranks [0, 1] did not return within 2 s (resources.call_timeout_s)

While a call waits, the ranks' heartbeats are watched (:mod:`rlcore.workers.liveness`): one still
for ``heartbeat_timeout_s`` (30 s, ``resources.heartbeat_timeout_s``) ends the call.

A user ``runtime_env`` may add environment variables but not override the ones the group sets
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...): that raises ``WorkerGroupError`` before any
actor starts, as verl's "Cannot override protected system env".

Worker modules must be importable in the actor processes; Ray puts the driver's working
directory on their path. For modules elsewhere (e.g. test helpers), pass
``runtime_env={"env_vars": {"PYTHONPATH": folder}}``.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlcore.config.schema import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
)
from rlcore.dispatch import (
    DEFAULT_MESH,
    DispatchCall,
    DispatchError,
    DispatchInfo,
    Execute,
    GroupFuture,
    MethodSpec,
    get_dispatch_mode,
    get_method_spec,
)
from rlcore.errors import (
    RlcoreError,
    WorkerError,
    WorkerGroupError,
    WorkerLostError,
    WorkerTimeoutError,
)
from rlcore.workers import liveness
from rlcore.workers._group_util import (
    _UNPLACED_STATES,
    _actor_state,
    _check_mesh,
    _death_cause,
    _first_line,
    _fmt_share,
    _plain,
)
from rlcore.workers.colocate import ClassWithInitArgs, ColocatedWorker
from rlcore.workers.resources import ResourcePool
from rlcore.workers.waiting import (
    CALL_TIMEOUT_KEY,
    START_TIMEOUT_KEY,
    seconds_setting,
    wait_in_completion_order,
)
from rlcore.workers.worker import Worker, find_free_port, node_ip_address

log = logging.getLogger(__name__)

__all__ = ["PROTECTED_ENV", "RayWorkerGroup", "registered_methods"]

# Set by the group for each actor; a user runtime_env may not override them.
PROTECTED_ENV = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
    }
)
# After a rank fails, how long to look for a peer that died (the likelier root cause): Ray
# reports a SIGKILLed actor on this node within about a second.
_DEATH_GRACE_S = 3.0

_RESERVED = frozenset(
    {
        "world_size",
        "role",
        "spawn",
        "shutdown",
        "execute_all",
        "execute_all_sync",
        "execute_rank",
        "execute_rank_zero",
        "dispatch_info",
        "process_info",
        "workers",
        "method_names",
    }
)


def registered_methods(cls: type[Any]) -> dict[str, MethodSpec]:
    """Every ``register``-ed method of ``cls``, found along its MRO (subclass wins)."""
    out: dict[str, MethodSpec] = {}
    for name in dir(cls):
        if name.startswith("__"):
            continue
        spec = get_method_spec(getattr(cls, name, None))
        if spec is not None:
            out[name] = spec
    return out


class RayWorkerGroup:
    """Ray actors of one worker class placed on a resource pool (see the module docstring)."""

    def __init__(
        self,
        resource_pool: ResourcePool,
        ray_cls_with_init: ClassWithInitArgs,
        *,
        role: str = "worker",
        runtime_env: Mapping[str, Any] | None = None,
        who: str | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
    ) -> None:
        import ray

        cls = ray_cls_with_init.cls
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            msg = (
                f"role {role}: {cls!r} must be an undecorated subclass of rlcore.workers.Worker "
                "(the group applies ray.remote itself)"
            )
            raise TypeError(msg)
        self._role = role
        self._route: str | None = None  # set on per-role views of a colocated group
        self._cls = cls
        self._async_methods: frozenset[str] = frozenset()
        self._info_cache: dict[str, list[DispatchInfo]] = {}
        self._owner = True
        self._pool = resource_pool
        self._who = who or f"role {role}"
        self._call_timeout_s = seconds_setting("call_timeout_s", call_timeout_s)
        start_s = seconds_setting("start_timeout_s", start_timeout_s)
        self._heartbeat_timeout_s = seconds_setting("heartbeat_timeout_s", heartbeat_timeout_s)
        self.method_names: list[str] = []
        self._actors: list[Any] = []
        # What a replacement of this group starts again with (rlcore.workers.restart).
        self._restart_args = (resource_pool, ray_cls_with_init, role, runtime_env, who)
        self._start_timeout_s = start_timeout_s
        # Unknown dispatch modes fail here, before anything is placed.
        roles: Mapping[str, ClassWithInitArgs] = {}
        if issubclass(cls, ColocatedWorker):
            roles = (
                ray_cls_with_init.args[0]
                if ray_cls_with_init.args
                else ray_cls_with_init.kwargs["roles"]
            )
        for c in [cls, *(spec.cls for spec in roles.values())]:
            for mspec in registered_methods(c).values():
                get_dispatch_mode(mspec.dispatch_mode)
        base_env = dict(runtime_env or {})
        user_vars = {str(k): str(v) for k, v in (base_env.pop("env_vars", {}) or {}).items()}
        clash = sorted(PROTECTED_ENV & user_vars.keys())
        if clash:
            msg = (
                f"role {role}: Cannot override protected system env {clash} in runtime_env; "
                "the group sets them for each actor (threads follow the pool's cpus_per_process)"
            )
            raise WorkerGroupError(msg)

        # A place among the pool's groups first: a group too many fails before anything starts.
        resource_pool.attach(self._who)
        try:
            locations = resource_pool.locations(who=self._who)
            self._world_size = len(locations)
            self._start(resource_pool, locations, ray_cls_with_init, base_env, user_vars, start_s)
        except BaseException:
            for a in self._actors:
                ray.kill(a, no_restart=True)
            self._actors.clear()
            resource_pool.detach(self._who)
            raise

        self._views: dict[str, RayWorkerGroup] = {}
        if roles:
            for role_name, spec in roles.items():
                view = self._make_view(role_name, spec.cls)
                self._views[role_name] = view
                for m in view.method_names:
                    self._bind(f"{role_name}_{m}", getattr(view, m))
        else:
            self._async_methods = _async_methods(cls)
            for name, mspec in registered_methods(cls).items():
                self._bind(name, self._make_proxy(name, mspec))

    def _start(
        self,
        pool: ResourcePool,
        locations: Sequence[Any],
        cls_with_init: ClassWithInitArgs,
        base_env: Mapping[str, Any],
        user_vars: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        """Start one actor per location and wait (bounded) until every ``__init__`` is done."""
        import ray

        role = self._role
        threads = max(1, math.floor(pool.cpus_per_process))
        share = pool.actor_share()
        remote_cls = ray.remote(self._cls)

        def start(rank: int, addr: str | None, port: int | None) -> Any:
            loc = locations[rank]
            env = {
                **user_vars,
                "RANK": str(rank),
                "WORLD_SIZE": str(self._world_size),
                "LOCAL_RANK": str(loc.local_rank),
                "LOCAL_WORLD_SIZE": str(loc.local_world_size),
                "OMP_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads),
            }
            if addr is not None and port is not None:
                env |= {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
            strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(
                placement_group=loc.placement_group,
                placement_group_bundle_index=loc.bundle_index,
            )
            return remote_cls.options(  # type: ignore[attr-defined]
                num_cpus=share["num_cpus"],
                num_gpus=share["num_gpus"],
                scheduling_strategy=strategy,
                runtime_env={**base_env, "env_vars": env},
            ).remote(*cls_with_init.args, **cls_with_init.kwargs)

        # torch.distributed needs rank 0's address and a free port there. When rank 0 lands on
        # the driver's node the driver picks the port and all actors start at once; otherwise
        # rank 0 starts first, picks it, and the others follow.
        pg0 = locations[0].placement_group
        bundle_nodes = ray.util.placement_group_table(pg0).get("bundles_to_node_id", {})
        here = ray.get_runtime_context().get_node_id()
        if bundle_nodes.get(locations[0].bundle_index) == here:
            addr, port = node_ip_address(), find_free_port()
            self._actors = [start(r, addr, port) for r in range(self._world_size)]
        else:
            self._actors = [start(0, None, None)]
            refs = [self._actors[0].rlcore_master_address.remote()]
            addr, port = self._gather(refs, "__init__", [0], timeout_s=timeout_s)[0]
            self._actors += [start(r, addr, port) for r in range(1, self._world_size)]
        self.master_addr, self.master_port = addr, port
        # Waits for every __init__, so construction errors surface here, with role and rank.
        self.process_info: list[dict[str, Any]] = self._gather(
            [a.rlcore_process_info.remote(role) for a in self._actors],
            "__init__",
            list(range(self._world_size)),
            timeout_s=timeout_s,
        )

    # --- views for colocated roles ------------------------------------------------------

    def _make_view(self, role_name: str, cls: type[Any]) -> RayWorkerGroup:
        view = object.__new__(RayWorkerGroup)
        view._role = f"{self._role}.{role_name}"
        view._route = role_name
        view._cls = cls
        view._async_methods = _async_methods(cls)
        view._info_cache = {}
        view._owner = False
        view._pool = self._pool
        view._who = self._who
        view._call_timeout_s = self._call_timeout_s
        view._heartbeat_timeout_s = self._heartbeat_timeout_s
        view.method_names = []
        view._world_size = self._world_size
        view._actors = self._actors
        view.master_addr, view.master_port = self.master_addr, self.master_port
        view.process_info = self.process_info
        view._views = {}
        for name, mspec in registered_methods(cls).items():
            view._bind(name, view._make_proxy(name, mspec))
        return view

    def spawn(self) -> dict[str, RayWorkerGroup]:
        """Per-role views of a colocated group (they share this group's actors)."""
        if not self._views:
            msg = f"role {self._role}: spawn() needs a group built from create_colocated_worker_cls"
            raise TypeError(msg)
        return dict(self._views)

    # --- properties -----------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def role(self) -> str:
        return self._role

    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, in rank order."""
        return list(self._actors)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not proxies: say which ones exist.
        if name.startswith("_"):
            raise AttributeError(name)
        known = ", ".join(self.__dict__.get("method_names", [])) or "none"
        role = self.__dict__.get("_role")
        msg = f"worker group {role!r} has no method {name!r}; registered: {known}"
        raise AttributeError(msg)

    # --- calling --------------------------------------------------------------------------

    def _bind(self, name: str, fn: Callable[..., Any]) -> None:
        if name in _RESERVED or name in type(self).__dict__:
            msg = f"role {self._role}: registered method {name!r} clashes with a group attribute"
            raise DispatchError(msg)
        setattr(self, name, fn)
        self.method_names.append(name)

    def _remote(
        self, rank: int, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        actor = self._actors[rank]
        if self._route is None:
            return getattr(actor, method).remote(*args, **kwargs)
        # An async role method runs on the worker's event loop (awaited there), as it would
        # in a group of its own.
        via = "rlcore_call_role_async" if method in self._async_methods else "rlcore_call_role"
        return getattr(actor, via).remote(self._route, method, *args, **kwargs)

    def _make_proxy(self, name: str, spec: MethodSpec) -> Callable[..., Any]:
        mode = get_dispatch_mode(spec.dispatch_mode)

        def proxy(*args: Any, **kwargs: Any) -> Any:
            call = DispatchCall(group=self, method=name)
            arg_lists, kwarg_lists = mode.dispatch_fn(call, *args, **kwargs)
            for i, items in [*enumerate(arg_lists), *kwarg_lists.items()]:
                if len(items) != self._world_size:
                    msg = (
                        f"{name}: dispatch mode {mode.name} gave {len(items)} items for "
                        f"argument {i}, expected one per rank ({self._world_size})"
                    )
                    raise DispatchError(msg)
            ranks = [0] if spec.execute_mode == Execute.RANK_ZERO else list(range(self._world_size))
            refs = [
                self._remote(
                    r, name, [a[r] for a in arg_lists], {k: v[r] for k, v in kwarg_lists.items()}
                )
                for r in ranks
            ]

            def resolve(rs: list[Any]) -> list[Any]:
                return self._gather(rs, name, ranks)

            if spec.execute_mode == Execute.RANK_ZERO:
                fut = GroupFuture(refs=refs, resolve=resolve, collect=lambda outs: outs[0])
            else:
                fut = GroupFuture(
                    refs=refs,
                    resolve=resolve,
                    collect=lambda outs: mode.collect_fn(call, outs),
                    shards=mode.shards_fn(call, refs) if mode.shards_fn else None,
                    shard_kind=mode.shard_kind,
                    pad_size=call.pad_size,
                )
            return fut.get() if spec.blocking else fut

        proxy.__name__ = name
        proxy.__qualname__ = f"{type(self).__name__}.{name}"
        proxy.__doc__ = getattr(getattr(self._cls, name, None), "__doc__", None)
        return proxy

    def execute_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank with the same arguments; wait; list of outputs."""
        ranks = list(range(self._world_size))
        return self._gather([self._remote(r, method, args, kwargs) for r in ranks], method, ranks)

    def execute_rank(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._gather([self._remote(rank, method, args, kwargs)], method, [rank])[0]

    def execute_all_sync(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """verl's name for :meth:`execute_all` (which waits here)."""
        return self.execute_all(method, *args, **kwargs)

    def execute_rank_zero(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """verl's name: call ``method`` on rank 0 only and wait for its result."""
        return self.execute_rank(0, method, *args, **kwargs)

    def dispatch_info(self, mesh: str = DEFAULT_MESH) -> list[DispatchInfo]:
        """Each rank's data-parallel place in ``mesh`` (cached once every rank declared one).

        Ranks that never called ``Worker.set_dispatch_info`` each form their own
        data-parallel group.
        """
        if mesh in self._info_cache:
            return self._info_cache[mesh]
        ranks = list(range(self._world_size))
        if self._route is None:
            refs = [a.rlcore_dispatch_info.remote(mesh) for a in self._actors]
        else:
            refs = [a.rlcore_role_dispatch_info.remote(self._route, mesh) for a in self._actors]
        got: list[DispatchInfo | None] = self._gather(refs, "dispatch_info", ranks)
        if all(g is None for g in got):
            return [DispatchInfo(dp_rank=r, dp_size=self._world_size) for r in ranks]
        if any(g is None for g in got):
            missing = [r for r, g in enumerate(got) if g is None]
            msg = (
                f"role {self._role}: ranks {missing} did not call set_dispatch_info(mesh={mesh!r})"
            )
            raise DispatchError(msg)
        infos = [g for g in got if g is not None]
        _check_mesh(self._role, mesh, infos)
        self._info_cache[mesh] = infos
        return infos

    # --- errors ---------------------------------------------------------------------------

    def _gather(
        self,
        refs: list[Any],
        method: str,
        ranks: Sequence[int],
        *,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Every rank's result, in order; the first failure to arrive raises at once.

        A plain ``ray.get(refs)`` waits for the refs in order: when rank 1 dies while rank 0
        waits for it in a collective, the driver would sit on rank 0's result until the
        collective timeout. Waiting for whichever ref finishes first surfaces the death as
        soon as Ray notices it (about a second after a SIGKILL on this node). The whole wait
        is bounded by ``timeout_s`` (default: the group's call timeout).
        """
        import ray
        from ray.exceptions import RayActorError, RayError

        index = {ref: i for i, ref in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending = set(index)
        limit = self._call_timeout_s if timeout_s is None else timeout_s
        setting = START_TIMEOUT_KEY if method == "__init__" else CALL_TIMEOUT_KEY

        def on_timeout(left: list[int], waited: float) -> BaseException:
            return self._timeout_error(method, [ranks[i] for i in left], limit, waited, setting)

        waiter = wait_in_completion_order(
            refs,
            timeout_s=limit,
            on_timeout=on_timeout,
            on_tick=self._on_wait_tick(method, ranks),
            poll_s=liveness.POLL_S,  # the heartbeats' poll: it bounds a stopped rank's report
        )
        try:
            for i in waiter:
                ref = refs[i]
                pending.discard(ref)
                try:
                    out[i] = ray.get(ref)  # finished: returns at once
                except RayActorError as died:
                    raise self._worker_error(died, ranks[i], method) from died
                except RayError as failed:
                    # A peer's death often shows first as a collective error in a
                    # live rank ("Connection closed by peer"): name the dead one.
                    root = self._dead_peer(list(pending), index, ranks)
                    err = self._worker_error(
                        root[1] if root else failed, root[0] if root else ranks[i], method
                    )
                    if root is None:  # or a stopped one: its timed-out peer is the symptom
                        info = self.__dict__.get("process_info")
                        still = [ranks[index[r]] for r in pending]
                        err = (
                            liveness.stopped_rank(self._role, info, still, method, ranks[i]) or err
                        )
                    raise err from failed
        except RayError as err:  # raised by ray.wait itself: no rank to name
            raise self._worker_error(err, None, method) from err
        if len(index) < len(refs):  # the same ref twice: fill the duplicates
            out = [out[index[ref]] for ref in refs]
        return out

    @property
    def call_timeout_s(self) -> float:
        """The bound of one call's wait (``resources.call_timeout_s``)."""
        return self._call_timeout_s

    def check_heartbeats(self, ranks: Sequence[int], method: str) -> None:
        """Raise the one-line :class:`WorkerError` for the first of ``ranks`` whose heartbeat
        stopped (:func:`rlcore.workers.liveness.check_ranks`): for a wait on another group's
        call that only finishes when these ranks answer (a broadcast to them)."""
        liveness.check_ranks(
            self._role, self.__dict__.get("process_info"), ranks, method, self._heartbeat_timeout_s
        )

    def _on_wait_tick(
        self, method: str, ranks: Sequence[int]
    ) -> Callable[[list[int], float], None] | None:
        """Hook run while a call waits (every few seconds); a liveness check may raise here."""

        def check(left: list[int], waited: float) -> None:
            # A stopped or wedged rank never finishes: its heartbeat stops (workers.liveness).
            info = self.__dict__.get("process_info")
            liveness.check_ranks(
                self._role, info, [ranks[i] for i in left], method, self._heartbeat_timeout_s
            )

        return check

    def _timeout_error(
        self, method: str, ranks: list[int], limit: float, waited: float, setting: str
    ) -> WorkerTimeoutError:
        if method == "__init__":
            what = self._start_state(ranks)
            msg = (
                f"role {self._role}: ranks {ranks} did not start within {limit:g} s "
                f"({setting}): {what}"
            )
        else:
            msg = (
                f"role {self._role}: method {method} on ranks {ranks} did not return within "
                f"{limit:g} s ({setting}); the workers may be stuck (a hang, a deadlocked "
                "collective) or the call needs a longer timeout"
            )
        return WorkerTimeoutError(msg)

    def _start_state(self, ranks: list[int]) -> str:
        """Why actors have not started: not yet placed (resources) or still in ``__init__``."""
        states = {r: _actor_state(self._actors[r]) for r in ranks if r < len(self._actors)}
        unplaced = [r for r, (st, pid) in states.items() if st in _UNPLACED_STATES and not pid]
        running = {r: pid for r, (st, pid) in states.items() if pid}
        parts = []
        if unplaced:
            parts.append(
                f"ranks {unplaced} not placed in their bundles of pool {self._pool.name!r} "
                f"(no process yet; each actor asks {_fmt_share(self._pool.actor_share())}; "
                f"groups on the pool: {', '.join(self._pool.groups)}; other actors or jobs may "
                "hold the bundles)"
            )
        if running:
            pids = ", ".join(str(p) for p in running.values())
            parts.append(
                f"ranks {list(running)} still in __init__ (pids {pids}; a slow model load or a "
                "hang: raise resources.start_timeout_s or look at the workers' logs)"
            )
        other = [r for r in states if r not in unplaced and r not in running]
        if other:
            parts.append(f"ranks {other} in an unknown state")
        return "; ".join(parts)

    def _dead_peer(
        self, pending: list[Any], index: Mapping[Any, int], ranks: Sequence[int]
    ) -> tuple[int, Exception] | None:
        """A rank among ``pending`` whose actor died, looked for during a short grace."""
        import ray
        from ray.exceptions import RayActorError, RayError

        if not pending:
            return None
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=_DEATH_GRACE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError as died:
                return ranks[index[ref]], died
            except RayError:
                continue
        return None

    def _worker_error(self, err: Exception, rank: int | None, method: str) -> WorkerError:
        from ray.exceptions import RayActorError, RayTaskError

        who = f"role {self._role} rank {rank if rank is not None else '?'}"
        info = self.__dict__.get("process_info")
        where = ""
        if rank is not None and info:
            where = f" (node {info[rank]['node_ip']}, pid {info[rank]['pid']})"
        if isinstance(err, RayTaskError):
            # The raised object is Ray's dual class RayTaskError(Cause); str() holds the
            # remote traceback, .cause the original exception.
            cause = getattr(err, "cause", None)
            if isinstance(cause, RlcoreError):
                # Raised on purpose, naming what to fix (a key only the worker could check, a
                # full disk): its one line. The remote traceback is for --debug.
                log.debug("%s failed in %s; remote traceback:\n%s", who, method, _plain(err))
                error = WorkerError(f"{who} failed in {method}: {_first_line(str(cause))}")
                error.remote_cause = cause
                return error
            if isinstance(cause, BaseException):
                kind, text = type(cause).__name__, str(cause)
            else:
                kind, text = type(err).__name__, _first_line(str(err))
            msg = f"{who} failed in {method}: {kind}: {text}\nremote traceback:\n{_plain(err)}"
            error = WorkerError(msg)
            error.remote_cause = cause if isinstance(cause, BaseException) else None
            return error
        elif isinstance(err, RayActorError):
            plain = _plain(err)
            msg = f"{who}{where} died in {method}: {_death_cause(plain)}\n{plain}"
            lost = WorkerLostError(msg)
            lost.role = self._role
            return lost
        else:
            msg = f"{who}{where} failed in {method}: {type(err).__name__}: {err}"
        return WorkerError(msg)

    # --- teardown -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Kill this group's actors (views of a colocated group leave them to their owner)."""
        if not self._owner:
            return
        import ray

        for a in self._actors:
            ray.kill(a, no_restart=True)
        self._actors.clear()
        self._pool.detach(self._who)


def _async_methods(cls: type[Any]) -> frozenset[str]:
    """Names of ``cls``'s registered methods that are ``async def``."""
    return frozenset(
        name
        for name in registered_methods(cls)
        if inspect.iscoroutinefunction(getattr(cls, name, None))
    )
