"""Starting or joining Ray for ``rlcore train``.

By default a private local Ray bound to 127.0.0.1 with the dashboard off (nothing listens on
other interfaces, nothing extra starts); ``RAY_ADDRESS`` or ``[resources] ray_address`` joins an
existing cluster instead. ``address="local"`` matters: a bare ``ray.init()`` would silently
attach to a cluster someone started on this machine with ``ray start``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from rlcore.config.schema import ResourcesConfig
from rlcore.errors import ResourceError

log = logging.getLogger(__name__)

__all__ = ["ray_init_kwargs", "start_ray", "stop_ray"]


def ray_init_kwargs(
    resources: ResourcesConfig, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``ray.init`` arguments for ``resources`` (pure: tested without starting Ray)."""
    env = os.environ if environ is None else environ
    address = env.get("RAY_ADDRESS") or resources.ray_address
    if address:
        return {"address": address}
    if resources.nnodes > 1:
        msg = (
            f"resources.nnodes = {resources.nnodes} needs a Ray cluster: start one "
            "(ray start --head on the first node, ray start --address=... on the others) "
            "and set RAY_ADDRESS or resources.ray_address"
        )
        raise ResourceError(msg)
    # Logical CPUs: enough slots for every worker even where they exceed the real cores.
    needed = math.ceil(resources.processes_per_node * resources.cpus_per_process) + 1
    return {
        "address": "local",
        "num_cpus": max(os.cpu_count() or 1, needed),
        "include_dashboard": False,
        "_node_ip_address": "127.0.0.1",
    }


def start_ray(resources: ResourcesConfig) -> bool:
    """Start (or join) Ray unless this process is already connected.

    Returns whether this call connected (the caller then owes a :func:`stop_ray`).
    """
    import ray  # heavy: only when a run really starts

    if ray.is_initialized():
        return False
    kwargs = ray_init_kwargs(resources)
    log.info("starting Ray: %s", ", ".join(f"{k}={v}" for k, v in kwargs.items()))
    ray.init(**kwargs, log_to_driver=True, configure_logging=False)
    return True


def stop_ray() -> None:
    """Disconnect; a private local Ray stops with its worker processes (a joined cluster
    only loses this driver's actors)."""
    import ray

    ray.shutdown()
