"""The selected engines' and rollout's own checks, before Ray starts.

``rlcore train`` runs it right after :func:`rlcore.preflight.preflight`, before Ray starts.
Each engine role of the run (actor, reference, critic, extra roles) and the rollout are
checked by their plugin's ``preflight`` classmethod (:meth:`rlcore.interfaces.BaseEngine.
preflight`, :meth:`rlcore.interfaces.BaseRollout.preflight`) with the spec the driver will
hand the worker, the processes of the role's pool and the section that configures it. A
plugin raises :class:`~rlcore.errors.ConfigError` in one line naming the key: tensor
parallelism that does not divide the processes or the heads, LoRA targets that match no module
of the model, a tensor-parallel rollout on CPU, ``compile = true`` for an engine without a
compiled update. Without this, each would surface inside a
worker after Ray started (the worker group still turns an ``RlcoreError`` raised there into
one line, :meth:`rlcore.workers.RayWorkerGroup`). The loggers of ``[trainer] loggers`` check
their destinations too (:func:`rlcore.preflight.trackers.check_loggers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.errors import ConfigError

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.interfaces import BaseAlgorithm, BaseEngine, BaseRollout
    from rlcore.plugins import PluginRegistry

__all__ = ["check_plugins"]


def check_plugins(config: RunConfig, registry: PluginRegistry | None = None) -> None:
    """Run every selected engine's and the rollout's ``preflight`` (see the module doc)."""
    from rlcore.roles.specs import EngineRole
    from rlcore.trainer.builder import build_algorithm
    from rlcore.trainer.specs import build_specs

    algorithm: BaseAlgorithm = build_algorithm(config, registry)
    specs = build_specs(config, algorithm, 1, registry=registry)
    res = config.resources
    engines: list[EngineRole] = [specs.policy.actor]
    if specs.policy.ref is not None:
        engines.append(specs.policy.ref)
    if specs.critic is not None:
        engines.append(specs.critic.critic)
    engines.extend(role.engine for role in specs.roles.values())
    for role in engines:
        cls: type[BaseEngine] = role.engine.resolve(registry)
        if role.spec.compile and not cls.supports_compile:
            msg = (
                f"{role.spec.role}.compile = true: engine {role.engine.name!r} has no compiled "
                f"update; set {role.spec.role}.compile = false (the fsdp2 engine has one)"
            )
            raise ConfigError(msg)
        options = role.engine.options if role.engine.options is not None else cls.Config()
        cls.preflight(role.spec, options, world_size=res.world_size, where=role.engine.where)
    rollout = specs.policy.rollout
    rollout_cls: type[BaseRollout] = rollout.resolve(registry)
    options = rollout.options if rollout.options is not None else rollout_cls.Config()
    pool = res.separate_rollout()
    world = pool.world_size if pool is not None else res.world_size
    rollout_cls.preflight(specs.policy.rollout_spec, options, world_size=world, where=rollout.where)
    from rlcore.preflight.trackers import check_loggers

    check_loggers(config, registry)  # each tracker's server answers, its folder is writable
