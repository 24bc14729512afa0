"""``[resources] placement`` and the asynchronous modes' keys, checked against the pools.

Part of :func:`rlcore.config.loader.load_config`'s rules across keys (docs/placement.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.config.schema import COLOCATED_ROLES, GLOBAL_POOL, PLACEABLE_ROLES

if TYPE_CHECKING:
    from rlcore.config.convert import Problem
    from rlcore.config.schema import AlgorithmConfig, ResourcesConfig, TrainerConfig

__all__ = ["placement_problems"]


def placement_problems(
    res: ResourcesConfig,
    trainer: TrainerConfig | None = None,
    algorithm: AlgorithmConfig | None = None,
    *,
    rm_enabled: bool = True,
) -> list[Problem]:
    """``[resources] placement`` against the pools: each role on a pool that exists, the
    implicit pool's name not redefined, every declared pool used, the rollout's pool its
    own; ``fully_async``'s staleness policy (docs/placement.md). A role named neither
    here nor in :data:`COLOCATED_ROLES` (a judge's, a ``[roles.NAME]``) is checked against
    the roles the run declares before Ray starts
    (:func:`rlcore.preflight.roles.check_placed_roles`)."""
    problems: list[Problem] = []
    if trainer is not None and trainer.async_mode == "fully_async":
        rollout_is = getattr(algorithm.options if algorithm else None, "rollout_is", None)
        if trainer.staleness_policy == "reweight" and rollout_is in (None, "none"):
            msg = (
                "'reweight' trains stale samples relying on algorithm.rollout_is; set "
                'algorithm.rollout_is = "token" (or "sequence"), or use "drop"'
            )
            problems.append((("trainer", "staleness_policy"), msg))
    defined = [GLOBAL_POOL, *sorted(res.pools)]
    if GLOBAL_POOL in res.pools:
        msg = (
            f"{GLOBAL_POOL!r} is the implicit pool of resources.nnodes x "
            "resources.processes_per_node; give the new pool another name"
        )
        problems.append((("resources", "pools", GLOBAL_POOL), msg))
    rollout_pool = res.pool_of("rollout")
    for role, pool in res.placement.items():
        where = ("resources", "placement", role)
        if role in COLOCATED_ROLES:
            msg = (
                f"role {role!r} cannot be placed on a pool of its own (placeable: "
                f"{', '.join(PLACEABLE_ROLES)}, a judge's or an algorithm's frozen role); "
                f"the actor, reference and critic stay on {GLOBAL_POOL!r}"
            )
            problems.append((where, msg))
        elif pool != GLOBAL_POOL and pool not in res.pools:
            msg = (
                f"pool {pool!r} is not defined (defined: {', '.join(defined)}); add "
                f"[resources.pools.{pool}] or name a defined pool"
            )
            problems.append((where, msg))
        elif role == "rm" and not rm_enabled:
            msg = "the reward model is not enabled; set reward_model.enable = true or remove it"
            problems.append((where, msg))
        elif role != "rollout" and pool == rollout_pool != GLOBAL_POOL:
            msg = (
                f"pool {pool!r} holds the rollout, which keeps its pool to itself (the weight "
                f"bridge spans its processes); place {role!r} on another pool"
            )
            problems.append((where, msg))
    if problems:  # an unused pool is then most likely the misspelt one: one line is enough
        return problems
    used = set(res.placement.values())
    for name in sorted(res.pools):
        if name != GLOBAL_POOL and name not in used:
            msg = (
                f"no role is placed on pool {name!r}; set resources.placement.rollout = "
                f'"{name}" or remove the table'
            )
            problems.append((("resources", "pools", name), msg))
    return problems
