"""The roles a run places beside the policy, checked before Ray starts.

A role the algorithm declares (:attr:`BaseAlgorithm.extra_roles`) without a section or a
``model.path``, a section no role asks for, and a model folder that does not exist are each
one line naming the key. So is a batched reward's generation role (a judge,
:attr:`BaseBatchReward.roles`) whose model folder does not exist
(``reward.options.<name>.<model_key>``), and a ``resources.placement`` entry naming a role
the run does not have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.errors import ConfigError
from rlcore.preflight.model import check_model_folder

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rlcore.config import RunConfig
    from rlcore.interfaces import ExtraRole, GenerationRole
    from rlcore.plugins import PluginRegistry

__all__ = ["check_extra_roles", "check_placed_roles", "check_reward_roles", "reward_roles"]


def check_extra_roles(config: RunConfig, declared: Sequence[ExtraRole]) -> None:
    """Every declared role has ``[roles.<name>]`` with an existing ``model.path``; every
    ``[roles.<name>]`` is declared. One line naming the key, before Ray starts."""
    names = {role.name for role in declared}
    algo = config.algorithm.name
    for name in config.roles:
        if name not in names:
            asked = ", ".join(sorted(names)) or "none"
            msg = (
                f"[roles.{name}]: algorithm {algo!r} declares no role {name!r} (its extra "
                f"roles: {asked}); remove the section or select the algorithm that uses it"
            )
            raise ConfigError(msg)
    for role in declared:
        section = config.roles.get(role.name)
        if section is None or not section.model.path:
            msg = (
                f"roles.{role.name}.model.path: algorithm {algo!r} needs the role "
                f"{role.name!r} ({role.computes}); set it to a local Hugging Face model folder"
            )
            raise ConfigError(msg)
        check_model_folder(section.model.path, f"roles.{role.name}.model.path")


def reward_roles(
    config: RunConfig, registry: PluginRegistry | None = None
) -> list[tuple[str, GenerationRole]]:
    """``(reward name, role)`` for each generation role of the selected batched rewards;
    builds each batched reward (its ``__init__`` should stay cheap: models load in roles)."""
    from rlcore.interfaces import BaseBatchReward
    from rlcore.plugins import Component

    found: list[tuple[str, GenerationRole]] = []
    reward = config.reward
    for name in reward.selected():
        component = Component(
            kind="reward", name=name, options=reward.options.get(name), where="[reward]"
        )
        if not issubclass(component.resolve(registry), BaseBatchReward):
            continue
        scorer: BaseBatchReward = component.build(registry=registry)
        try:
            found.extend((name, role) for role in scorer.roles)
        finally:
            scorer.close()
    return found


def check_reward_roles(config: RunConfig, registry: PluginRegistry | None = None) -> list[str]:
    """Every batched reward's generation role has an existing model folder; one line naming
    ``reward.options.<name>.<model_key>`` otherwise. Returns the roles' names."""
    names = []
    for name, role in reward_roles(config, registry):
        check_model_folder(role.model_path, f"reward.options.{name}.{role.model_key}")
        names.append(role.name)
    return names


def check_placed_roles(
    config: RunConfig, extra_roles: Sequence[ExtraRole], reward_role_names: Sequence[str]
) -> None:
    """Every role ``resources.placement`` names exists in this run: the rollout, the reward
    model, an extra role of the algorithm or a batched reward's role (a judge). The config
    loader has refused the roles that never move already; one line naming the key."""
    from rlcore.config.schema import COLOCATED_ROLES, PLACEABLE_ROLES

    known = [*PLACEABLE_ROLES, *(r.name for r in extra_roles), *reward_role_names]
    for role in config.resources.placement:
        if role not in known and role not in COLOCATED_ROLES:
            msg = (
                f"resources.placement.{role}: this run has no role {role!r} (roles that may "
                f"be placed here: {', '.join(known)})"
            )
            raise ConfigError(msg)
