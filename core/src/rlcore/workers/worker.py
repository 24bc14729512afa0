"""The base class of every process a worker group starts.

A ``Worker`` learns its place from environment variables the group sets when it places the
actor: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (the torch.distributed names, so ``init_process_group`` needs nothing else),
plus ``RLCORE_ROLE`` and ``RLCORE_NUM_THREADS``. Rank 0 picks a free port on its own node;
the group reads it back and passes it to the other ranks.

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
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from rlcore.dispatch import DEFAULT_MESH, DispatchError, DispatchInfo
from rlcore.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "Worker",
    "collective_timeout_s",
    "find_free_port",
    "node_ip_address",
    "pin_torch_threads",
]

COLLECTIVE_TIMEOUT_ENV = "RLCORE_COLLECTIVE_TIMEOUT_S"
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0


def collective_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """Seconds a collective may wait for its peers: ``RLCORE_COLLECTIVE_TIMEOUT_S`` or 600.

    Long enough for a slow rank's generate or checkpoint save, short enough that a hang
    becomes an error the same hour.
    """
    env = os.environ if environ is None else environ
    raw = env.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        msg = f"{COLLECTIVE_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds"
        raise ConfigError(msg)
    return value


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


def pin_torch_threads() -> int:
    """Limit torch to this process's CPU share; returns the thread count.

    Measured on 2 cores: an unpinned 2-thread generate under contention ran 30x slower.
    """
    n = int(os.environ.get("RLCORE_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or 1)
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
        self._role = env.get("RLCORE_ROLE", type(self).__name__)
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

    # --- torch.distributed ----------------------------------------------------------------

    def init_process_group(
        self, backend: str | None = None, timeout_s: float | None = None
    ) -> None:
        """Join the group's default process group (gloo on CPU, nccl when CUDA is there).

        ``timeout_s`` (default: :func:`collective_timeout_s`, i.e. ``RLCORE_COLLECTIVE_TIMEOUT_S``
        or 600 s) bounds the rendezvous and every later collective: a rank left waiting in an
        all-reduce that a dead or diverged peer never joins raises ``RuntimeError`` instead of
        hanging the run (gloo honours it directly; nccl through its watchdog).
        """
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            # Ray usually narrows CUDA_VISIBLE_DEVICES to this actor's one GPU: device 0.
            torch.cuda.set_device(self._local_rank % max(1, torch.cuda.device_count()))
        from rlcore.workers.bound_store import rendezvous_store  # listens on MASTER_ADDR only

        timeout = collective_timeout_s() if timeout_s is None else timeout_s
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

    def rlcore_process_info(self) -> dict[str, Any]:
        from rlcore.workers.liveness import (
            start_heartbeat,  # the group watches this process from now
        )

        start_heartbeat(node_ip_address())
        return {
            "pid": os.getpid(),
            "node_ip": node_ip_address(),
            "rank": self._rank,
            "num_threads": self._num_threads,
        }
