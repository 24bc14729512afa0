"""Where worker processes go: resource pools on Ray placement groups.

``ResourcePool([2, 2])`` asks for two nodes with two processes each (or
``ResourcePool(nnodes=2, processes_per_node=2)``); each process gets one bundle of
``cpus_per_process`` CPUs, plus one GPU with ``use_gpu=True``. One placement group per node
(``STRICT_PACK``, so a node's ranks share a machine), created lazily on first use and checked
against the cluster first.

``ResourcePoolManager({"global_pool": pool}, {"actor_rollout_ref": "global_pool", ...})`` maps
roles to pools; roles sharing a pool are colocated. ``check_resources()`` compares what every
pool asks for with what the cluster has and raises ``ResourceError`` before any placement group
or actor exists::

    role actor needs 4 CPU bundles of 1 CPU (4 CPU in all), the cluster has 2 CPU (2 free);
    lower the process count or add nodes

Several worker groups may share one pool, as in verl: up to ``max_colocate_count`` groups
(default 10, verl's default) each place one actor per bundle, and each of those actors asks for
``1/max_colocate_count`` of its bundle (CPU, and GPU with ``use_gpu``), so they run side by side
on the same devices. A group beyond that count is refused at once, before any placement group or
actor exists::

    pool 'global_pool' holds 2 groups (max_colocate_count=2: role actor, role critic); role
    reward asked for a third; raise max_colocate_count or give it another pool

Differences from verl's ``RayResourcePool``: a bundle holds ``cpus_per_process`` CPUs (verl:
``max_colocate_count`` CPUs) because rlcore sizes torch's threads from the bundle, and
``use_gpu`` defaults to False (the CPU path is the tested default here). The placement-group
wait is bounded: ``ready_timeout_s`` (120 s; a run's ``resources.placement_timeout_s``), see
:mod:`rlcore.workers.waiting`.

Ray is imported only when a pool is used.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from rlcore.config.schema import DEFAULT_PLACEMENT_TIMEOUT_S
from rlcore.errors import ResourceError

log = logging.getLogger(__name__)

__all__ = ["BundleLocation", "ResourcePool", "ResourcePoolManager", "check_fits"]


@attrs.frozen(kw_only=True)
class BundleLocation:
    """One process slot: its placement group, bundle index and place on its node."""

    placement_group: Any
    bundle_index: int
    local_rank: int
    local_world_size: int


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class ResourcePool:
    """``nodes x processes`` slots on Ray placement groups (see the module docstring)."""

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        *,
        nnodes: int | None = None,
        processes_per_node: int | None = None,
        use_gpu: bool = False,
        cpus_per_process: float = 1.0,
        name: str = "global_pool",
        max_colocate_count: int = 10,
        ready_timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT_S,
    ) -> None:
        if process_on_nodes is None:
            if nnodes is None or processes_per_node is None:
                msg = "ResourcePool needs process_on_nodes or both nnodes and processes_per_node"
                raise ResourceError(msg)
            process_on_nodes = [processes_per_node] * nnodes
        counts = list(process_on_nodes)
        if not counts or any(not isinstance(c, int) or c < 1 for c in counts):
            msg = f"ResourcePool {name!r}: process_on_nodes must be positive ints, got {counts}"
            raise ResourceError(msg)
        if cpus_per_process <= 0:
            msg = f"ResourcePool {name!r}: cpus_per_process must be > 0, got {cpus_per_process}"
            raise ResourceError(msg)
        if not isinstance(max_colocate_count, int) or max_colocate_count < 1:
            msg = (
                f"ResourcePool {name!r}: max_colocate_count must be a positive int, "
                f"got {max_colocate_count!r}"
            )
            raise ResourceError(msg)
        from rlcore.workers.waiting import seconds_setting

        self.process_on_nodes = counts
        self.max_colocate_count = max_colocate_count
        self._groups: list[str] = []
        self.use_gpu = use_gpu
        self.cpus_per_process = float(cpus_per_process)
        self.name = name
        self.ready_timeout_s = seconds_setting("ready_timeout_s", ready_timeout_s)
        self._pgs: list[Any] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def created(self) -> bool:
        return self._pgs is not None

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus_per_process}
        if self.use_gpu:
            b["GPU"] = 1.0
        return b

    def actor_share(self) -> dict[str, float]:
        """What each group's actor asks of its bundle: ``1/max_colocate_count`` of it.

        Rounded down to Ray's resource precision (1e-4) so ``max_colocate_count`` shares
        never add up to more than the bundle.
        """
        k = self.max_colocate_count
        share = {"num_cpus": math.floor(self.cpus_per_process / k * 1e4) / 1e4}
        share["num_gpus"] = math.floor(1e4 / k) / 1e4 if self.use_gpu else 0.0
        return share

    @property
    def groups(self) -> list[str]:
        """The groups placed on this pool, in the order they came."""
        return list(self._groups)

    def attach(self, who: str) -> None:
        """Reserve one of the ``max_colocate_count`` group places for ``who``, or raise."""
        if len(self._groups) >= self.max_colocate_count:
            n = len(self._groups)
            msg = (
                f"pool {self.name!r} holds {n} group{'s' if n != 1 else ''} "
                f"(max_colocate_count={self.max_colocate_count}: {', '.join(self._groups)}); "
                f"{who} asked for one more; raise max_colocate_count or give it another pool"
            )
            raise ResourceError(msg)
        self._groups.append(who)

    def detach(self, who: str) -> None:
        """Give back the place ``who`` held (its actors are gone)."""
        if who in self._groups:
            self._groups.remove(who)

    def demand(self) -> dict[str, float]:
        """Total resources this pool reserves."""
        return {k: v * self.world_size for k, v in self.bundle().items()}

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU"
        per = f"{_fmt(self.cpus_per_process)} CPU" + (" + 1 GPU" if self.use_gpu else "")
        return f"{self.world_size} {kind} bundles of {per}"

    def placement_groups(self, *, who: str | None = None) -> list[Any]:
        """The pool's placement groups, one per node; created (after a fit check) on first call."""
        if self._pgs is None:
            import ray
            from ray.util.placement_group import placement_group

            check_fits([(who or f"pool {self.name!r}", self)])
            pgs = [
                placement_group(
                    [self.bundle() for _ in range(n)],
                    strategy="STRICT_PACK",
                    name=f"rlcore_{self.name}_{i}",
                )
                for i, n in enumerate(self.process_on_nodes)
            ]
            ready, _ = ray.wait(
                [pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.ready_timeout_s
            )
            if len(ready) < len(pgs):
                for pg in pgs:
                    ray.util.remove_placement_group(pg)
                msg = (
                    f"{who or 'pool ' + repr(self.name)}: placement groups for "
                    f"{self.describe()} were not ready after {self.ready_timeout_s:g} s "
                    "(resources.placement_timeout_s); other jobs may hold the resources"
                )
                raise ResourceError(msg)
            self._pgs = pgs
        return self._pgs

    def locations(self, *, who: str | None = None) -> list[BundleLocation]:
        """One slot per rank, in rank order (node by node)."""
        out = []
        for pg, n in zip(self.placement_groups(who=who), self.process_on_nodes, strict=True):
            out += [
                BundleLocation(placement_group=pg, bundle_index=i, local_rank=i, local_world_size=n)
                for i in range(n)
            ]
        return out

    def remove(self) -> None:
        """Release the placement groups (kill the pool's actors first)."""
        if self._pgs is not None:
            import ray

            for pg in self._pgs:
                ray.util.remove_placement_group(pg)
            self._pgs = None
        self._groups.clear()

    def __repr__(self) -> str:
        return f"ResourcePool({self.name!r}, {self.process_on_nodes}, {self.describe()})"


def _needs(who: str) -> str:
    return "need" if who.startswith("roles ") else "needs"


def _cluster() -> tuple[dict[str, float], dict[str, float], list[dict[str, float]]]:
    import ray

    if not ray.is_initialized():
        msg = "Ray is not running: call ray.init() (rlcore train does) before creating pools"
        raise ResourceError(msg)
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    return dict(ray.cluster_resources()), dict(ray.available_resources()), nodes


def check_fits(requests: Sequence[tuple[str, ResourcePool]], *, settle_s: float = 10.0) -> None:
    """Raise ``ResourceError`` unless every ``(who, pool)`` not yet created fits the cluster.

    Checks the sum against the cluster's total (at once) and free resources, then each node's
    share of each pool against the largest nodes (a node's ranks must share a machine). Freed
    placement groups and killed actors reach Ray's free count with a delay, so a request that
    fits the total but not the free count is re-checked for up to ``settle_s`` seconds.
    """
    pending = [(who, p) for who, p in requests if not p.created]
    if not pending:
        return
    total, free, nodes = _cluster()
    deadline = time.monotonic() + settle_s
    for kind in ("CPU", "GPU"):
        need = sum(p.demand().get(kind, 0.0) for _, p in pending)
        if need <= 0:
            continue
        have_total, have_free = total.get(kind, 0.0), free.get(kind, 0.0)
        while need <= have_total + 1e-9 and need > have_free + 1e-9:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
            have_free = _cluster()[1].get(kind, 0.0)
        if need > have_free + 1e-9:
            parts = "; ".join(
                f"{who} {_needs(who)} {p.describe()}" for who, p in pending if p.demand().get(kind)
            )
            msg = (
                f"{parts} ({_fmt(need)} {kind} in all), the cluster has {_fmt(have_total)} "
                f"{kind} ({_fmt(have_free)} free); lower the process count or add nodes"
            )
            raise ResourceError(msg)
    # Per node: every node slot of every pool must fit on some node (greedy, largest first).
    caps = sorted(nodes, key=lambda r: (r.get("GPU", 0.0), r.get("CPU", 0.0)), reverse=True)
    for who, p in pending:
        for n in p.process_on_nodes:
            want = {k: v * n for k, v in p.bundle().items()}
            if not any(all(node.get(k, 0.0) >= v for k, v in want.items()) for node in caps):
                biggest = caps[0] if caps else {}
                msg = (
                    f"{who} {_needs(who)} {n} processes on one node "
                    f"({', '.join(f'{_fmt(v)} {k}' for k, v in want.items())}), the largest "
                    f"node has {_fmt(biggest.get('CPU', 0.0))} CPU and "
                    f"{_fmt(biggest.get('GPU', 0.0))} GPU; use fewer processes per node"
                )
                raise ResourceError(msg)


class ResourcePoolManager:
    """Roles -> pools. Roles that share a pool share its processes (colocation)."""

    def __init__(self, pools: Mapping[str, ResourcePool], role_to_pool: Mapping[str, str]) -> None:
        for role, pool_name in role_to_pool.items():
            if pool_name not in pools:
                msg = (
                    f"role {role!r} is mapped to pool {pool_name!r}, which is not defined; "
                    f"defined pools: {', '.join(sorted(pools)) or 'none'}"
                )
                raise ResourceError(msg)
        self.pools = dict(pools)
        self.role_to_pool = dict(role_to_pool)

    def _who(self, pool_name: str) -> str:
        roles = [r for r, p in self.role_to_pool.items() if p == pool_name]
        if not roles:
            return f"pool {pool_name!r}"
        return ("role " if len(roles) == 1 else "roles ") + ", ".join(roles)

    def check_resources(self) -> None:
        """Raise ``ResourceError`` if the pools in use cannot all be placed; starts nothing."""
        used = sorted(set(self.role_to_pool.values()))
        check_fits([(self._who(name), self.pools[name]) for name in used])

    def create_resource_pools(self) -> None:
        """Check everything first, then create every used pool's placement groups."""
        self.check_resources()
        for name in sorted(set(self.role_to_pool.values())):
            self.pools[name].placement_groups(who=self._who(name))

    def get_resource_pool(self, role: str) -> ResourcePool:
        try:
            return self.pools[self.role_to_pool[role]]
        except KeyError:
            msg = (
                f"no resource pool for role {role!r}; roles: {', '.join(sorted(self.role_to_pool))}"
            )
            raise ResourceError(msg) from None

    def who(self, role: str) -> str:
        return self._who(self.role_to_pool[role])
