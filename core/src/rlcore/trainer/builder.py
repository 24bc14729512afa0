"""From a resolved :class:`RunConfig` to the objects a run needs.

Driver side: the reward manager and the algorithm (for advantages), each built through
:class:`rlcore.plugins.Component`, as the workers build theirs. Worker side: one resource
pool (``nnodes × processes_per_node`` processes) holding every role, colocated in one process
per device: the policy (``ActorRolloutRefWorker``) and, when the algorithm needs one, the
critic. The specs decide which roles exist; nothing here branches on a plugin name.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.errors import ConfigError
from rlcore.plugins import Component

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.interfaces import BaseAlgorithm
    from rlcore.plugins import PluginRegistry
    from rlcore.resources import ResourcePool
    from rlcore.reward import RewardManager
    from rlcore.trainer.specs import RunSpecs
    from rlcore.workers import RayWorkerGroup

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
    return RewardManager(
        tokenizer,
        rewards,
        sources=reward.sources,
        default=reward.default,
        weights=reward.weights,
        timeout_s=reward.timeout_s,
        batch_timeout_s=reward.batch_timeout_s,
        num_workers=reward.num_workers,
    )


@attrs.define
class Workers:
    """The placed worker processes and the per-role views the driver calls."""

    group: RayWorkerGroup
    policy: RayWorkerGroup
    critic: RayWorkerGroup | None
    pool: ResourcePool
    roles: dict[str, RayWorkerGroup] = attrs.Factory(dict)  # the algorithm's extra roles

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def shutdown(self) -> None:
        """Kill the worker processes and release their placement groups."""
        self.group.shutdown()
        self.pool.remove()


def build_workers(config: RunConfig, specs: RunSpecs) -> Workers:
    """Check resources, place one process per slot holding every role, initialise models.

    Each role's worker gets its spec (``specs.policy``, ``specs.critic``), not the config.
    """
    from rlcore.resources import ResourcePool, ResourcePoolManager
    from rlcore.trainer.extra_roles import ExtraRoleWorker
    from rlcore.trainer.roles import ActorRolloutRefWorker, CriticWorker
    from rlcore.workers import ClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls

    res = config.resources
    pool = ResourcePool(
        nnodes=res.nnodes,
        processes_per_node=res.processes_per_node,
        use_gpu=res.device == "cuda",
        cpus_per_process=res.cpus_per_process,
        ready_timeout_s=res.placement_timeout_s,
        # Placement-group names must not clash with an earlier run in the same Ray session.
        name=f"{config.trainer.experiment_name}-{uuid.uuid4().hex[:8]}",
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
    # Every role shares the one pool: colocated in one process per device.
    manager = ResourcePoolManager({"global_pool": pool}, {name: "global_pool" for name in roles})
    manager.check_resources()
    group = RayWorkerGroup(
        pool,
        create_colocated_worker_cls(roles),
        role="rlcore",
        call_timeout_s=res.call_timeout_s,
        start_timeout_s=res.start_timeout_s,
        heartbeat_timeout_s=res.heartbeat_timeout_s,
    )
    try:
        views = group.spawn()
        critic = views.get(CRITIC)
        if critic is not None:
            critic.init_model()
        for name in specs.roles:
            views[name].init_model()
        # The policy last: its rollout sizes inference memory from what is left.
        views[POLICY].init_model()
    except BaseException:
        group.shutdown()
        pool.remove()
        raise
    log.info(
        "workers: %d process(es), roles %s%s",
        group.world_size,
        ", ".join(roles),
        " (+ reference)" if specs.policy.ref is not None else "",
    )
    extra = {name: views[name] for name in specs.roles}
    return Workers(group=group, policy=views[POLICY], critic=critic, pool=pool, roles=extra)
