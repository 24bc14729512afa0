"""The roles a run places beside the policy, checked before Ray starts.

A role the algorithm declares (:attr:`BaseAlgorithm.extra_roles`) without a section or a
``model.path``, a section no role asks for, a model folder that does not exist and a role
whose tokenizer is not the policy's (it scores the policy's token ids) are each one line
naming the key. So is a batched reward's generation role (a judge,
:attr:`BaseBatchReward.roles`) whose model folder does not exist
(``reward.options.<name>.<model_key>``), and a ``resources.placement`` entry naming a role
the run does not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlcore.errors import ConfigError, DataError
from rlcore.preflight.model import TOKENIZER_FILES, check_model_folder

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rlcore.config import RunConfig
    from rlcore.interfaces import ExtraRole, GenerationRole
    from rlcore.plugins import PluginRegistry

__all__ = [
    "check_extra_roles",
    "check_placed_roles",
    "check_reward_roles",
    "check_role_tokenizer",
    "reward_roles",
]


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
        check_role_tokenizer(config, role.name, section.model.path)


def check_role_tokenizer(config: RunConfig, name: str, path: str) -> None:
    """A role that scores the policy's responses (a distillation teacher's log-probs) reads
    the policy's token ids, so the tokenizer in its folder, when it has one, must be the
    policy's (``model.tokenizer_path``): the same tokens at the same ids. One line if not."""
    from rlcore.data import load_tokenizer

    key = f"roles.{name}.model.path"
    folder, student = Path(path), Path(config.model.tokenizer_path)
    if folder.resolve() == student.resolve():
        return
    if not any((folder / file).is_file() for file in TOKENIZER_FILES):
        return  # weights only: nothing to compare (the policy's tokenizer is used)
    try:
        theirs = load_tokenizer(folder, require_chat_template=False).get_vocab()
        ours = load_tokenizer(student, require_chat_template=False).get_vocab()
    except DataError as err:
        msg = f"{key}: {err}"
        raise ConfigError(msg) from err
    if theirs == ours:
        return
    differences = []
    for label, only in (
        ("only in the role's", theirs.keys() - ours),
        ("only in the policy's", ours.keys() - theirs),
    ):
        if only:
            first = min(only, key=lambda t: theirs.get(t, ours.get(t, 0)))
            differences.append(f"{len(only)} tokens {label} (first: {first!r})")
    moved = sum(1 for t in theirs.keys() & ours.keys() if theirs[t] != ours[t])
    if moved:
        differences.append(f"{moved} tokens at other ids")
    msg = (
        f"{key}: the tokenizer in {folder} ({len(theirs)} tokens) is not the policy's "
        f"(model.tokenizer_path, {len(ours)} tokens): {', '.join(differences)}; the role "
        "scores the policy's token ids, so give it a model trained with the policy's tokenizer"
    )
    raise ConfigError(msg)


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
