"""The base class of every process a worker group starts.

A ``Worker`` learns its place from environment variables the group sets when it places the
actor: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (the torch.distributed names, so ``init_process_group`` needs nothing else),
plus ``OMP_NUM_THREADS`` (its CPU share). Rank 0 picks a free port on its own node; the group
reads it back and passes it to the other ranks, and names the worker's role in its first call.

The run's settings come in the worker's spec, not from the environment: a role's ``__init__``
calls :meth:`Worker.apply_settings` with its :class:`WorkerSettings` (collective timeout,
DataProto padding, disabled plugins) before anything else.

Subclasses stay undecorated (no ``@ray.remote``): the group applies ``ray.remote`` where it
places them, because Ray cannot pickle by value a class that touches torch.distributed
(torch 2.13: ``cannot pickle 'ConfigModuleInstance'``). Keep them importable from a module.

Public API: ``rank``, ``world_size``, ``local_rank``, ``local_world_size``, ``master_addr``,
``master_port``, ``role``, ``init_process_group(backend=None)``,
``set_dispatch_info(dp_rank=, dp_size=, is_collect=, mesh=)`` for mesh-aware dispatch.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

import attrs

from rlcore.config.schema import DEFAULT_COLLECTIVE_TIMEOUT_S
from rlcore.dispatch import DEFAULT_MESH, DispatchError, DispatchInfo
from rlcore.plugins import set_disabled_plugins

log = logging.getLogger(__name__)

__all__ = [
    "COLLECTIVE_TIMEOUT_KEY",
    "RoleWorker",
    "Worker",
    "WorkerSettings",
    "find_free_port",
    "node_ip_address",
    "pin_torch_threads",
]

COLLECTIVE_TIMEOUT_KEY = "resources.collective_timeout_s"


@attrs.frozen(kw_only=True)
class WorkerSettings:
    """The run's settings a worker process applies to itself, carried in each role's spec.

    ``collective_timeout_s`` (``resources.collective_timeout_s``): how long a collective waits
    for its peers; long enough for a slow rank's generate or checkpoint save, short enough
    that a hang becomes an error the same hour. ``auto_padding``: ``trainer.auto_padding``.
    ``disabled_plugins``: ``[plugins] disabled``.
    """

    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    auto_padding: bool = False
    disabled_plugins: tuple[str, ...] = ()

    def apply(self) -> None:
        """Set this process's switches (the driver applies the same ones to itself)."""
        from rlcore.protocol import DataProtoConfig  # torch: imported when a process applies it

        DataProtoConfig.auto_padding = self.auto_padding
        set_disabled_plugins(self.disabled_plugins)


def node_ip_address() -> str:
    """This node's address as Ray knows it (falls back to the hostname's address)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:  # pragma: no cover - ray is a dependency of rlcore
        pass
    return socket.gethostbyname(socket.gethostname())


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def pin_torch_threads(n: int | None = None) -> int:
    """Limit torch to ``n`` threads (default: ``OMP_NUM_THREADS``, which the worker group sets
    to the actor's CPU share, else 1); returns the thread count.

    Measured on 2 cores: an unpinned 2-thread generate under contention ran 30x slower.
    """
    if n is None:
        given = os.environ.get("OMP_NUM_THREADS", "").strip()
        n = int(given) if given.isdigit() and int(given) >= 1 else 1
    os.environ["OMP_NUM_THREADS"] = str(n)
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


class Worker:
    """Base of worker classes placed by a worker group (see the module docstring)."""

    def __init__(self) -> None:
        env = os.environ
        self._rank = int(env.get("RANK", "0"))
        self._world_size = int(env.get("WORLD_SIZE", "1"))
        self._local_rank = int(env.get("LOCAL_RANK", "0"))
        self._local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(self._world_size)))
        self._role = type(self).__name__  # until the group names it (rlcore_process_info)
        self._collective_timeout_s = DEFAULT_COLLECTIVE_TIMEOUT_S
        if self._rank == 0 and not env.get("MASTER_PORT"):
            # Rank 0 chooses; the group reads it back (rlcore_master_address) for the others.
            env["MASTER_ADDR"] = env.get("MASTER_ADDR") or node_ip_address()
            env["MASTER_PORT"] = str(find_free_port())
        self._master_addr = env.get("MASTER_ADDR", "127.0.0.1")
        self._master_port = int(env.get("MASTER_PORT", "0"))
        self._num_threads = pin_torch_threads()
        self._dispatch_info: dict[str, DispatchInfo] = {}

    # --- identity -------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    @property
    def master_addr(self) -> str:
        return self._master_addr

    @property
    def master_port(self) -> int:
        return self._master_port

    @property
    def role(self) -> str:
        return self._role

    def apply_settings(self, settings: WorkerSettings) -> None:
        """Apply the run's settings from this worker's spec (call first in ``__init__``)."""
        settings.apply()
        self._collective_timeout_s = settings.collective_timeout_s

    # --- torch.distributed ----------------------------------------------------------------

    def init_process_group(
        self, backend: str | None = None, timeout_s: float | None = None
    ) -> None:
        """Join the group's default process group (gloo on CPU, nccl when CUDA is there).

        ``timeout_s`` (default: the collective timeout of :meth:`apply_settings`,
        ``resources.collective_timeout_s``, 600 s) bounds the rendezvous and every later
        collective: a rank left waiting in an all-reduce that a dead or diverged peer never
        joins raises ``RuntimeError`` instead of
        hanging the run (gloo honours it directly; nccl through its watchdog).
        """
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        if backend is None:
            from rlcore.engine.device import process_group_backend

            # No spec says the device: the one rule, on the device this process can see.
            backend = process_group_backend("cuda" if torch.cuda.is_available() else "cpu")
        if backend == "nccl":
            # Ray usually narrows CUDA_VISIBLE_DEVICES to this actor's one GPU: device 0.
            torch.cuda.set_device(self._local_rank % max(1, torch.cuda.device_count()))
        from rlcore.workers.bound_store import rendezvous_store  # listens on MASTER_ADDR only

        timeout = self._collective_timeout_s if timeout_s is None else timeout_s
        store = rendezvous_store(
            self._master_addr,
            self._master_port,
            rank=self._rank,
            world_size=self._world_size,
            timeout_s=timeout,
        )
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=self._rank,
            world_size=self._world_size,
            timeout=timedelta(seconds=timeout),
        )

    # --- dispatch -------------------------------------------------------------------------

    def set_dispatch_info(
        self, *, dp_rank: int, dp_size: int, is_collect: bool = True, mesh: str = DEFAULT_MESH
    ) -> None:
        """Declare this rank's data-parallel place in ``mesh`` for the mesh dispatch modes.

        With tensor or pipeline parallelism, ranks of one data-parallel group get the same
        chunk and only the one with ``is_collect=True`` returns data. A mesh is declared once:
        declaring it again raises ``DispatchError`` (a ``ValueError``), as verl's
        ``_register_dispatch_collect_info`` does, so two engines cannot silently share a name.
        """
        if not 0 <= dp_rank < dp_size:
            msg = f"set_dispatch_info: dp_rank {dp_rank} is outside [0, {dp_size})"
            raise ValueError(msg)
        if mesh in self._dispatch_info:
            msg = (
                f"set_dispatch_info: mesh {mesh!r} is already declared on rank {self._rank} "
                f"({self._dispatch_info[mesh]}); give the second engine its own mesh name"
            )
            raise DispatchError(msg)
        self._dispatch_info[mesh] = DispatchInfo(
            dp_rank=dp_rank, dp_size=dp_size, is_collect=is_collect
        )

    # Methods below are called by the worker group, not by users.

    def rlcore_dispatch_info(self, mesh: str = DEFAULT_MESH) -> DispatchInfo | None:
        return self._dispatch_info.get(mesh)

    def rlcore_master_address(self) -> tuple[str, int]:
        return self._master_addr, self._master_port

    def rlcore_process_info(self, role: str | None = None) -> dict[str, Any]:
        """The group's first call: names this worker's role, starts its heartbeat."""
        from rlcore.workers.liveness import (
            start_heartbeat,  # the group watches this process from now
        )

        if role is not None:
            self._role = role
        start_heartbeat(node_ip_address())
        return {
            "pid": os.getpid(),
            "node_ip": node_ip_address(),
            "rank": self._rank,
            "num_threads": self._num_threads,
        }


class RoleWorker(Worker):
    """A worker built from a spec made on the driver (a role's: policy, critic, the rollout on
    its own pool, an extra role), whose ``settings`` (:class:`WorkerSettings`) it applies
    first."""

    spec: Any

    def __init__(self, spec: Any) -> None:
        super().__init__()
        self.apply_settings(spec.settings)
        self.spec = spec
