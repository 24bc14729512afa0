"""From a resolved :class:`RunConfig` to the objects a run needs.

Driver side: the reward manager and the algorithm (for advantages), each built through
:class:`rlcore.plugins.Component`, as the workers build theirs. Worker side: one resource
pool (``nnodes × processes_per_node`` processes) holding every role, colocated in one process
per device: the policy (``ActorRolloutRefWorker``) and, when the algorithm needs one, the
critic, the algorithm's extra roles and the batched rewards' generation roles (a judge,
:mod:`rlcore.roles.generation_roles`). With ``[resources] placement = { rollout = "gen" }``
the rollout is a worker group of its own on ``[resources.pools.gen]``
(:class:`~rlcore.roles.rollout_worker.RolloutWorker`), and ``Workers.policy`` is a
:class:`~rlcore.trainer.placement.SplitPolicy` with the policy group's methods. The frozen
roles (the reward model ``rm``, a judge, an algorithm's ``[roles.NAME]``) may be placed too:
the roles named for one pool share its processes, colocated there as they would be on
``global_pool``, in a worker group of their own (docs/placement.md). The specs decide which
roles exist; nothing here branches on a plugin name.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.config.schema import GLOBAL_POOL
from rlcore.errors import ConfigError
from rlcore.plugins import Component

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.interfaces import BaseAlgorithm
    from rlcore.plugins import PluginRegistry
    from rlcore.reward import RewardManager
    from rlcore.trainer.specs import RunSpecs
    from rlcore.workers import RayWorkerGroup
    from rlcore.workers.resources import ResourcePool

log = logging.getLogger(__name__)

__all__ = [
    "Workers",
    "build_algorithm",
    "build_reward_manager",
    "build_workers",
    "total_training_steps",
]

POLICY = "actor_rollout_ref"
CRITIC = "critic"
ROLLOUT = "rollout"


def build_algorithm(config: RunConfig, registry: PluginRegistry | None = None) -> BaseAlgorithm:
    """The driver's copy of the algorithm (advantages, KL-in-reward state)."""
    section = config.algorithm
    component = Component(
        kind="algorithm", name=section.name, options=section.options, where="[algorithm]"
    )
    algorithm: BaseAlgorithm = component.build(registry=registry)
    return algorithm


def total_training_steps(config: RunConfig, batches_per_epoch: int) -> int:
    """``trainer.total_steps``, else ``total_epochs`` × batches per epoch."""
    trainer = config.trainer
    if trainer.total_steps is not None:
        return trainer.total_steps
    assert trainer.total_epochs is not None  # resolved: set whenever total_steps is not
    return trainer.total_epochs * batches_per_epoch


def build_reward_manager(
    config: RunConfig, tokenizer: Any, registry: PluginRegistry | None = None
) -> RewardManager:
    """Every selected reward plugin, built from its ``[reward.options.NAME]`` config."""
    from rlcore.reward import RewardManager

    reward = config.reward
    rewards = {
        name: Component(
            kind="reward", name=name, options=reward.options.get(name), where="[reward]"
        ).build(registry=registry)
        for name in reward.selected()
    }
    weights = dict(reward.weights)
    every_row: tuple[str, ...] = ()
    rm = config.reward_model
    if rm.enable:  # the reward model's scores (phase "rm") as the scorer "rm" of every row
        from rlcore.reward.model import RM_SCORER, RewardModelScores

        rewards[RM_SCORER] = RewardModelScores()
        weights[RM_SCORER] = rm.weight
        every_row = (RM_SCORER,)
    return RewardManager(
        tokenizer,
        rewards,
        sources=reward.sources,
        default=reward.default,
        weights=weights,
        timeout_s=reward.timeout_s,
        batch_timeout_s=reward.batch_timeout_s,
        num_workers=reward.num_workers,
        every_row=every_row,
        rm_threshold=rm.threshold,
    )


@attrs.define
class Workers:
    """The placed worker processes and the per-role views the driver calls."""

    group: RayWorkerGroup
    policy: RayWorkerGroup  # a SplitPolicy (same methods) when the rollout has its own pool
    critic: RayWorkerGroup | None
    pool: ResourcePool
    roles: dict[str, RayWorkerGroup] = attrs.Factory(dict)  # the algorithm's extra roles
    # the batched rewards' generation roles (a judge), handed to the reward manager
    generation_roles: dict[str, RayWorkerGroup] = attrs.Factory(dict)
    reward_model: RayWorkerGroup | None = None  # [reward_model] enable: the role "rm"
    rollout_group: RayWorkerGroup | None = None  # the rollout's own group and pool, if any
    rollout_pool: ResourcePool | None = None
    # the groups of roles placed on pools of their own (resources.placement), with the pools
    placed: list[tuple[RayWorkerGroup, ResourcePool]] = attrs.Factory(list)

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def shutdown(self) -> None:
        """Kill the worker processes and release their placement groups."""
        from rlcore.trainer.placement import SplitPolicy

        if isinstance(self.policy, SplitPolicy):  # every replica, as the fleet is now
            self.policy.shutdown()
        elif self.rollout_group is not None:
            self.rollout_group.shutdown()
        if self.rollout_pool is not None:
            self.rollout_pool.remove()
        for group, pool in self.placed:
            group.shutdown()
            pool.remove()
        self.group.shutdown()
        self.pool.remove()


def build_workers(config: RunConfig, specs: RunSpecs) -> Workers:
    """Check resources, place one process per slot holding every role, initialise models.

    Each role's worker gets its spec (``specs.policy``, ``specs.critic``), not the config.
    """
    from rlcore.roles.critic import CriticWorker
    from rlcore.roles.extra_roles import ExtraRoleWorker
    from rlcore.roles.generation_roles import GenerationRoleWorker
    from rlcore.roles.policy import ActorRolloutRefWorker
    from rlcore.roles.reward_model import RM_ROLE, RewardModelWorker
    from rlcore.workers import ClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
    from rlcore.workers.resources import ResourcePool, ResourcePoolManager

    res = config.resources
    run_id = f"{config.trainer.experiment_name}-{uuid.uuid4().hex[:8]}"
    pool = ResourcePool(
        nnodes=res.nnodes,
        processes_per_node=res.processes_per_node,
        use_gpu=res.device == "cuda",
        cpus_per_process=res.cpus_per_process,
        ready_timeout_s=res.placement_timeout_s,
        # Placement-group names must not clash with an earlier run in the same Ray session.
        name=run_id,
    )
    roles = {POLICY: ClassWithInitArgs(ActorRolloutRefWorker, specs.policy)}
    if specs.critic is not None:
        roles[CRITIC] = ClassWithInitArgs(CriticWorker, specs.critic)
    for name, role_spec in specs.roles.items():  # the algorithm's extra roles, placed alike
        if name in roles:
            msg = (
                f"[roles.{name}]: {name!r} is a built-in role's name; the algorithm must rename it"
            )
            raise ConfigError(msg)
        roles[name] = ClassWithInitArgs(ExtraRoleWorker, role_spec)
    for name, gen_spec in specs.generation_roles.items():  # a judge: placed alike, frozen
        if name in roles:
            msg = (
                f"reward role {name!r}: the name is taken by another role ({', '.join(roles)}); "
                "give the reward's role another name"
            )
            raise ConfigError(msg)
        roles[name] = ClassWithInitArgs(GenerationRoleWorker, gen_spec)
    if specs.reward_model is not None:  # beside the policy unless placed, like the others
        if RM_ROLE in roles:
            msg = f"[roles.{RM_ROLE}]: {RM_ROLE!r} is the reward model's role; rename the role"
            raise ConfigError(msg)
        roles[RM_ROLE] = ClassWithInitArgs(RewardModelWorker, specs.reward_model)
    # Every role shares the one pool (colocated in one process per device), except the roles
    # resources.placement puts on pools of their own: the rollout (a group of its own, with
    # the weight bridge), the reward model and frozen roles (colocated per pool).
    placement = {name: res.pool_of(name) for name in roles}
    by_pool: dict[str, dict[str, ClassWithInitArgs]] = {}
    for name, cls in roles.items():
        by_pool.setdefault(placement[name], {})[name] = cls
    pools = {GLOBAL_POOL: pool}
    pools.update({name: _own_pool(config, run_id, name) for name in by_pool if name != GLOBAL_POOL})
    rollout_pool = _rollout_pool(config, run_id, specs)
    if rollout_pool is not None and specs.rollout is not None:
        pools[specs.rollout.pool] = rollout_pool
        placement[ROLLOUT] = specs.rollout.pool
    manager = ResourcePoolManager(pools, placement)
    manager.check_resources()  # every pool together, before any of them is created
    groups: list[tuple[RayWorkerGroup, ResourcePool]] = []

    def start(pool_name: str, who: str) -> dict[str, RayWorkerGroup]:
        group = RayWorkerGroup(
            pools[pool_name],
            create_colocated_worker_cls(by_pool[pool_name]),
            role=who,
            call_timeout_s=res.call_timeout_s,
            start_timeout_s=res.start_timeout_s,
            heartbeat_timeout_s=res.heartbeat_timeout_s,
        )
        groups.append((group, pools[pool_name]))
        return group.spawn()

    try:
        views = start(GLOBAL_POOL, "rlcore")
        for name in sorted(set(by_pool) - {GLOBAL_POOL}):  # a death or hang names the pool
            views |= start(name, f"{', '.join(by_pool[name])} on pool {name!r}")
        critic = views.get(CRITIC)
        if critic is not None:
            critic.init_model()
        for name in [*specs.roles, *specs.generation_roles]:
            views[name].init_model()
        if RM_ROLE in views:
            views[RM_ROLE].init_model()
        # The policy last: its rollout sizes inference memory from what is left.
        views[POLICY].init_model()
    except BaseException:
        for started, its_pool in groups:
            started.shutdown()
            its_pool.remove()
        raise
    group = groups[0][0]
    log.info(
        "workers: %d process(es), roles %s%s",
        group.world_size,
        ", ".join(roles),
        " (+ reference)" if specs.policy.ref is not None else "",
    )
    extra = {name: views[name] for name in specs.roles}
    workers = Workers(
        group=group,
        policy=views[POLICY],
        critic=critic,
        pool=pool,
        roles=extra,
        generation_roles={name: views[name] for name in specs.generation_roles},
        reward_model=views.get(RM_ROLE),
        placed=groups[1:],
    )
    if rollout_pool is not None:
        try:
            _place_rollout(config, specs, workers, rollout_pool)
        except BaseException:
            workers.shutdown()
            raise
    return workers


def _rollout_pool(config: RunConfig, run_id: str, specs: RunSpecs) -> ResourcePool | None:
    """The rollout's own pool (``[resources.pools.<name>]``), None when colocated."""
    if config.resources.separate_rollout() is None or specs.rollout is None:
        return None
    return _own_pool(config, run_id, specs.rollout.pool)


def _own_pool(config: RunConfig, run_id: str, name: str, suffix: str = "") -> ResourcePool:
    """``[resources.pools.<name>]`` as a resource pool (its placement groups named per run;
    ``suffix``: an added rollout replica's copy of the pool)."""
    from rlcore.workers.resources import ResourcePool

    res = config.resources
    own = res.pools[name]
    return ResourcePool(
        nnodes=own.nnodes,
        processes_per_node=own.processes_per_node,
        use_gpu=res.device == "cuda",
        cpus_per_process=own.cpus_per_process or res.cpus_per_process,
        ready_timeout_s=res.placement_timeout_s,
        name=f"{run_id}-{name}{suffix}",
    )


def _place_rollout(
    config: RunConfig, specs: RunSpecs, workers: Workers, pool: ResourcePool
) -> None:
    """Start the rollout group on ``pool``, open the weight bridge, send version 0."""
    from typing import cast

    from rlcore.roles.partial_rollout import PartialRolloutWorker
    from rlcore.roles.rollout_worker import RolloutWorker
    from rlcore.trainer.placement import SplitPolicy
    from rlcore.workers import ClassWithInitArgs, RayWorkerGroup
    from rlcore.workers.resources import check_fits

    res, spec = config.resources, specs.rollout
    assert spec is not None
    # Partial rollouts: a Ray async actor whose weight receive runs beside its generation.
    worker = PartialRolloutWorker if spec.rollout_spec.partial_rollouts else RolloutWorker

    def start(on: ResourcePool, role: str) -> RayWorkerGroup:
        return RayWorkerGroup(
            on,
            ClassWithInitArgs(worker, spec),
            role=role,
            call_timeout_s=res.call_timeout_s,
            start_timeout_s=res.start_timeout_s,
            heartbeat_timeout_s=res.heartbeat_timeout_s,
        )

    role = f"{ROLLOUT} on pool {spec.pool!r}"  # a death or hang names the pool
    rollout = start(pool, role)
    run_id = pool.name.removesuffix(f"-{spec.pool}")

    def spawn(numbers: list[int]) -> list[tuple[RayWorkerGroup, ResourcePool]]:
        """Added replicas (``rlcore scale``): pools like the first, placed together or not at
        all (within resources.placement_timeout_s), each its own group."""
        pools = [_own_pool(config, run_id, spec.pool, f"-replica{k}") for k in numbers]
        whos = [f"{role} (replica {k})" for k in numbers]
        started: list[tuple[RayWorkerGroup, ResourcePool]] = []
        try:
            check_fits(list(zip(whos, pools, strict=True)))
            for who, its_pool in zip(whos, pools, strict=True):
                started.append((start(its_pool, who), its_pool))
        except BaseException:
            for group, _ in started:
                group.shutdown()
            for its_pool in pools:
                its_pool.remove()
            raise
        return started

    workers.rollout_group, workers.rollout_pool = rollout, pool
    rollout.init_model()
    pools = (
        f"{GLOBAL_POOL!r} (trainer, {workers.group.world_size} processes) and "
        f"{spec.pool!r} (rollout, {rollout.world_size} processes)"
    )
    split = SplitPolicy(workers.policy, rollout, pools=pools, pool=pool, spawn=spawn)
    split.open_bridge()
    # The driver calls the split policy where it calls the policy group (same methods).
    workers.policy = cast("RayWorkerGroup", split)
    log.info("rollout: %d process(es) on pool %r", rollout.world_size, spec.pool)
