"""The ``[resources]`` section: where workers run, the resource pools, and the bound on every wait
of a run."""

from __future__ import annotations

from typing import Any

import attrs
from attrs import validators as v

from rlcore.config.fields import _pos
from rlcore.interfaces import (
    POLL_MAX_S,
    Device,
    key,
    seconds,
)

# Bounds on every wait of a run ([resources] *_timeout_s), in seconds.
DEFAULT_CALL_TIMEOUT_S = 3600.0  # one worker-group call: a whole generate or update may be one
DEFAULT_START_TIMEOUT_S = 600.0  # a group's actors placed and their __init__ done
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0  # a pool's placement groups reserved by Ray
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # each torch.distributed collective in the workers
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0  # a worker's heartbeat still for this long: stopped


def _timeout(default: float, text: str) -> Any:
    # Driver-side deadlines (ray.wait is handed at most a poll interval) and thread waits.
    return key(default, text, validator=seconds())


# The implicit pool of ``resources.nnodes × processes_per_node`` (verl's name for it).
GLOBAL_POOL = "global_pool"
# Roles that ``resources.placement`` may put on a pool of their own (docs/placement.md): the
# rollout, the reward model, and by name a frozen role an algorithm declares ([roles.NAME],
# e.g. a distillation teacher) or a batched reward declares (a judge). The roles below hold
# the trained weights and stay on global_pool.
PLACEABLE_ROLES = ("rollout", "rm")
COLOCATED_ROLES = ("actor", "ref", "critic", "actor_rollout_ref")
DEFAULT_WEIGHT_SYNC_BUCKET_BYTES = 64 << 20  # 64 MiB per broadcast across pools


@attrs.frozen(kw_only=True)
class PoolConfig:
    """``[resources.pools.<name>]``: a resource pool besides the implicit ``global_pool``.

    ``cpus_per_process`` unset: the top-level ``resources.cpus_per_process``.
    """

    nnodes: int = key(1, "Nodes of the pool.", validator=_pos)
    processes_per_node: int = key(1, "Worker processes per node of the pool.", validator=_pos)
    cpus_per_process: float | None = key(
        None,
        "CPUs per worker of the pool; unset: resources.cpus_per_process.",
        validator=v.optional(v.gt(0.0)),
    )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.processes_per_node


@attrs.frozen(kw_only=True)
class ResourcesConfig:
    """``[resources]``: where workers run. Data-parallel size = nnodes × processes_per_node.

    The top-level ``nnodes``/``processes_per_node`` are the implicit pool ``global_pool``,
    which every role shares by default (colocated). ``pools`` declares more pools and
    ``placement`` maps a role to one, as verl's ``resource_pool_spec`` and ``mapping``:
    ``placement = { rollout = "gen" }`` gives the rollout a worker group of its own on
    ``[resources.pools.gen]``; the trainer's weights reach it after every update over a
    collective group spanning both pools, in buckets of ``weight_sync_bucket_bytes``.
    """

    device: Device = key(
        "cpu",
        "Where workers compute: cpu (gloo) or cuda (one GPU per process).",
        validator=v.in_(("cpu", "cuda")),
    )
    nnodes: int = key(1, "Nodes of the run.", validator=_pos)
    processes_per_node: int = key(
        1, "Worker processes per node (one per GPU on cuda).", validator=_pos
    )
    ray_address: str | None = key(
        None, "Ray cluster to join; unset: RAY_ADDRESS, else a private local Ray."
    )
    cpus_per_process: float = key(
        1.0,
        "CPUs reserved per worker; its torch threads are floor(this), at least 1.",
        validator=v.gt(0.0),
    )
    driver_num_threads: int = key(
        1, "Torch threads of the driver process (rewards and advantages).", validator=_pos
    )
    call_timeout_s: float = _timeout(
        DEFAULT_CALL_TIMEOUT_S, "Time limit of one worker-group call (s)."
    )
    start_timeout_s: float = _timeout(
        DEFAULT_START_TIMEOUT_S, "Time limit for a worker group's actors to start (s)."
    )
    placement_timeout_s: float = _timeout(
        DEFAULT_PLACEMENT_TIMEOUT_S, "Time limit for Ray to reserve a pool's placement groups (s)."
    )
    collective_timeout_s: float = key(
        DEFAULT_COLLECTIVE_TIMEOUT_S,
        "Time limit of each torch.distributed collective (s).",
        # gloo and the c10d store add it to their clocks in ms/ns: measured, 2147484 s holds,
        # 2.1e9 s hangs the rendezvous and 8.6e13 s fails it at once.
        validator=seconds(POLL_MAX_S, "torch.distributed's clocks, a C int of ms"),
    )
    heartbeat_timeout_s: float = _timeout(
        DEFAULT_HEARTBEAT_TIMEOUT_S,
        "A worker whose heartbeat stops for this long is reported stopped (s).",
    )
    pools: dict[str, PoolConfig] = key(
        factory=dict,
        help="[resources.pools.NAME]: resource pools besides the implicit global_pool "
        "(docs/placement.md).",
    )
    placement: dict[str, str] = key(
        factory=dict,
        help="Role -> pool name: rollout, rm, a judge's or an algorithm's frozen role "
        "(e.g. teacher); unmapped roles stay on global_pool, colocated.",
    )
    weight_sync_bucket_bytes: int = key(
        DEFAULT_WEIGHT_SYNC_BUCKET_BYTES,
        "Bytes per broadcast when weights travel to a rollout on its own pool.",
        validator=_pos,
    )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.processes_per_node

    def pool_of(self, role: str) -> str:
        """The pool ``role`` is placed on (``global_pool`` unless ``placement`` says)."""
        return self.placement.get(role, GLOBAL_POOL)

    def separate_rollout(self) -> PoolConfig | None:
        """The rollout's own pool, or None when it is colocated with the actor (default)."""
        name = self.pool_of("rollout")
        return None if name == GLOBAL_POOL else self.pools.get(name)
