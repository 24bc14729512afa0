"""Starting or joining Ray for ``rlcore train``.

By default a private local Ray with the dashboard off and every port on 127.0.0.1: GCS,
raylet (node manager and object manager), runtime-env agent, worker and driver gRPC. Ray
binds its gRPC servers to loopback only when the node's IP *is* 127.0.0.1, and on Linux it
rewrites a requested 127.0.0.1 to the host's address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
is ``0`` (``ray._private.services.resolve_ip_for_localhost``), so a local run sets that
(:func:`loopback_only`). ``tests/test_loopback.py`` checks every listening socket of a run.

``RAY_ADDRESS`` or ``[resources] ray_address`` joins an existing cluster instead, bound as
that cluster was started; a loopback address keeps the driver on loopback too. The address
is probed first (:func:`check_reachable`): a closed port fails within :data:`JOIN_TIMEOUT_S`
and a port that accepts but does not answer as Ray's GCS within ``resources.start_timeout_s``,
each with one line (``ray.init`` would retry for minutes, or wait forever).
``address="local"`` matters: a bare ``ray.init()`` would silently attach to a cluster
someone started on this machine with ``ray start``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from rlcore.config.schema import ResourcesConfig
from rlcore.errors import ResourceError

log = logging.getLogger(__name__)

__all__ = [
    "JOIN_TIMEOUT_S",
    "LOOPBACK",
    "check_local_pools",
    "check_pools_before_ray",
    "check_reachable",
    "loopback_only",
    "ray_init_kwargs",
    "start_ray",
    "stop_ray",
]

LOOPBACK = "127.0.0.1"
JOIN_TIMEOUT_S = 10.0  # how long an unreachable RAY_ADDRESS is retried before one line
# Ray's switch that keeps a node IP of 127.0.0.1 instead of the host's address (Linux).
_KEEP_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def loopback_only() -> None:
    """Make Ray keep 127.0.0.1 as this node's IP, so every Ray server binds loopback only.

    The variable is read when ``ray`` is imported (and inherited by Ray's own processes); the
    module constant is set as well for a ``ray`` imported earlier in this process.
    """
    os.environ[_KEEP_LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010 - untyped module


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of a GCS address; None for ``auto`` and ``ray://`` client addresses."""
    if address == "auto" or "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


# Ray's GCS is a gRPC server, so HTTP/2: after a client's connection preface it sends a
# SETTINGS frame (9-byte header: length 3, type 1 = 0x4, flags 1, stream id 4 = 0).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x4


def _grpc_answer(sock: socket.socket, deadline: float) -> bytes | None:
    """The first 9 bytes the server sends after our HTTP/2 preface (a frame header), fewer if
    it closed first; None if the deadline came first."""
    sock.sendall(_H2_PREFACE)
    got = b""
    while len(got) < 9:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(9 - len(got))
        except TimeoutError:
            return None
        if not chunk:
            break
        got += chunk
    return got


def _is_settings_frame(header: bytes) -> bool:
    if len(header) != 9:
        return False
    length = int.from_bytes(header[:3], "big")
    stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
    return header[3] == _H2_SETTINGS and stream == 0 and length % 6 == 0


def check_reachable(
    address: str,
    *,
    timeout_s: float = JOIN_TIMEOUT_S,
    key: str,
    timeout_key: str = "resources.start_timeout_s",
) -> None:
    """Fail with one line unless a Ray GCS answers at ``address`` within ``timeout_s``.

    A refused connection is retried for at most :data:`JOIN_TIMEOUT_S` (a head that is still
    starting). An accepted one must answer an HTTP/2 connection preface with a SETTINGS
    frame, as any gRPC server does at once: ``ray.init`` on a port that accepts TCP but is not
    Ray waits forever, so anything else (silence until ``timeout_s``, other bytes, a close)
    is one line naming the address, ``key`` and ``timeout_key``. With ``RAY_USE_TLS`` the
    GCS speaks TLS first: only the TCP connection is checked.
    """
    target = _host_port(address)
    if target is None:
        return
    start = time.monotonic()
    deadline = start + timeout_s
    refused_until = start + min(JOIN_TIMEOUT_S, timeout_s)
    tls = os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true", "yes")
    last: OSError | None = None
    while time.monotonic() < refused_until:
        try:
            sock = socket.create_connection(target, timeout=min(2.0, timeout_s))
        except OSError as err:
            last = err
            time.sleep(0.5)
            continue
        with sock:
            if tls:
                return
            try:
                header = _grpc_answer(sock, deadline)
            except OSError:  # reset by the peer: as a close, whatever listens is not Ray
                header = b""
        if header is not None and _is_settings_frame(header):
            return
        if header is None:
            answer = f"did not answer as Ray's GCS (a gRPC server) within {timeout_s:g} s"
        elif not header:
            answer = "closed the connection instead of answering as Ray's GCS (a gRPC server)"
        else:
            answer = f"answered {header[:9]!r}, not as Ray's GCS (a gRPC server)"
        msg = (
            f"{key} = {address}: something accepts connections there but {answer} "
            f"({timeout_key} = {timeout_s:g}); fix the address to the head's GCS port (ray "
            "start --head prints it), or unset it for a private local Ray"
        )
        raise ResourceError(msg)
    reason = (last.strerror or str(last)) if last is not None else "timed out"
    msg = (
        f"{key} = {address}: no Ray cluster answers there ({reason}, tried for "
        f"{min(JOIN_TIMEOUT_S, timeout_s):.0f} s); start one with `ray start --head`, fix the "
        "address, or unset it for a private local Ray"
    )
    raise ResourceError(msg)


def ray_init_kwargs(
    resources: ResourcesConfig, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``ray.init`` arguments for ``resources`` (pure: tested without starting Ray)."""
    env = os.environ if environ is None else environ
    address = env.get("RAY_ADDRESS") or resources.ray_address
    if address:
        target = _host_port(address)
        if target is not None and target[0] in _LOOPBACK_HOSTS:
            # A cluster on loopback: the driver stays there too (Ray would pick the host IP).
            return {"address": address, "_node_ip_address": LOOPBACK}
        return {"address": address}
    if resources.nnodes > 1:
        msg = (
            f"resources.nnodes = {resources.nnodes} needs a Ray cluster: start one "
            "(ray start --head on the first node, ray start --address=... on the others) "
            "and set RAY_ADDRESS or resources.ray_address"
        )
        raise ResourceError(msg)
    check_local_pools(resources)
    # Logical CPUs: enough slots for every worker even where they exceed the real cores.
    needed = sum(math.ceil(n * c) for _, n, c in _pool_demands(resources)) + 1
    return {
        "address": "local",
        "num_cpus": max(os.cpu_count() or 1, needed),
        "include_dashboard": False,
        "_node_ip_address": LOOPBACK,
    }


def start_ray(resources: ResourcesConfig) -> bool:
    """Start (or join) Ray unless this process is already connected.

    Returns whether this call connected (the caller then owes a :func:`stop_ray`).
    """
    kwargs = ray_init_kwargs(resources)
    if kwargs.get("_node_ip_address") == LOOPBACK:
        loopback_only()  # before ray is imported: Ray reads it at import
    import ray  # heavy: only when a run really starts

    if ray.is_initialized():
        return False
    if kwargs["address"] != "local":
        key = "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "resources.ray_address"
        check_reachable(kwargs["address"], key=key, timeout_s=resources.start_timeout_s)
    log.info("starting Ray: %s", ", ".join(f"{k}={v}" for k, v in kwargs.items()))
    ray.init(**kwargs, log_to_driver=True, configure_logging=False)
    return True


def stop_ray() -> None:
    """Disconnect; a private local Ray stops with its worker processes (a joined cluster
    only loses this driver's actors)."""
    import ray

    ray.shutdown()


def _pool_demands(resources: ResourcesConfig) -> list[tuple[str, int, float]]:
    """``(key, processes, cpus per process)`` of the implicit pool and every declared one."""
    out = [("resources", resources.world_size, resources.cpus_per_process)]
    for name, pool in sorted(resources.pools.items()):
        cpus = pool.cpus_per_process or resources.cpus_per_process
        out.append((f"resources.pools.{name}", pool.world_size, cpus))
    return out


def check_local_pools(
    resources: ResourcesConfig,
    *,
    cpu_count: int | None = None,
    gpu_count: int | None = None,
) -> None:
    """A private local Ray with declared pools: they must fit this machine; one line if not.

    Run before Ray starts. The one-pool default is left alone (Ray is then given as many
    logical CPUs as its processes ask for, so it runs on any laptop). Declaring pools asks
    for resources of their own, so together the pools' CPUs (processes x cpus_per_process)
    must fit ``os.cpu_count()`` and, on ``device = "cuda"``, their processes the visible
    GPUs (one each). A joined cluster is checked against what it really has when it is
    joined (:func:`rlcore.workers.resources.check_fits`), still before any worker starts.
    """
    if not resources.pools:
        return
    for name, pool in sorted(resources.pools.items()):
        if pool.nnodes > 1:
            msg = (
                f"resources.pools.{name}.nnodes = {pool.nnodes} needs a Ray cluster: start "
                "one and set RAY_ADDRESS or resources.ray_address"
            )
            raise ResourceError(msg)
    demands = _pool_demands(resources)
    have = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    need = sum(n * c for _, n, c in demands)
    if need > have + 1e-9:
        parts = " + ".join(f"{key} {n} x {c:g}" for key, n, c in demands)
        msg = (
            f"resources.pools: the pools ask for {need:g} CPUs ({parts}), this machine has "
            f"{have}; lower processes_per_node or cpus_per_process, or join a cluster "
            "(resources.ray_address)"
        )
        raise ResourceError(msg)
    if resources.device == "cuda":
        if gpu_count is None:
            import torch

            gpu_count = torch.cuda.device_count()
        procs = sum(n for _, n, _ in demands)
        if procs > gpu_count:
            msg = (
                f"resources.pools: the pools ask for {procs} GPUs (one per process), this "
                f"machine has {gpu_count}; lower processes_per_node or join a cluster"
            )
            raise ResourceError(msg)


def check_pools_before_ray(
    resources: ResourcesConfig, environ: Mapping[str, str] | None = None
) -> None:
    """:func:`check_local_pools` for a run on a private local Ray (no ``RAY_ADDRESS`` or
    ``resources.ray_address``); a joined cluster is checked when joined."""
    env = os.environ if environ is None else environ
    if not (env.get("RAY_ADDRESS") or resources.ray_address):
        check_local_pools(resources)
