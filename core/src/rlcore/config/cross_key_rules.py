"""Rules across keys of different sections, checked once every section validated on its own;
each problem names the key to change."""

from __future__ import annotations

from typing import Any

from rlcore.config.convert import Problem
from rlcore.config.fields import ROLES
from rlcore.config.placement_rules import placement_problems
from rlcore.config.schema import (
    BUILTIN_TOOL_TURNS,
    GLOBAL_POOL,
    AgentConfig,
    ResourcesConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutConfig,
    TrainerConfig,
)
from rlcore.reward.model import RM_SCORER


def _micro_rule(section: str, cfg: Any) -> list[Problem]:
    if cfg.micro_batch_size is not None and cfg.max_tokens_per_micro_batch is not None:
        msg = "set micro_batch_size or max_tokens_per_micro_batch, not both"
        return [((section, "max_tokens_per_micro_batch"), msg)]
    return []


def cross_key_problems(s: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    for section in ("actor", "ref", "critic", "reward_model"):
        if s.get(section) is not None:
            problems.extend(_micro_rule(section, s[section]))
    for name, role in (s.get(ROLES) or {}).items():
        problems.extend(_micro_rule(f"{ROLES}.{name}", role))
    agent: AgentConfig | None = s.get("agent")
    fixed = agent is not None and agent.turns() == "hermes"
    if agent is not None and fixed and agent.tool_parser not in BUILTIN_TOOL_TURNS:
        msg = (
            f"tool_parser {agent.tool_parser!r} has no fixed tool-turn text; set "
            'tool_turns = "chat_template" (or "auto")'
        )
        problems.append((("agent", "tool_turns"), msg))
    trainer: TrainerConfig | None = s.get("trainer")
    if trainer is not None and trainer.total_steps is not None and trainer.total_epochs:
        problems.append((("trainer", "total_steps"), "set total_steps or total_epochs, not both"))
    resources: ResourcesConfig | None = s.get("resources")
    if resources is not None:
        rm_section: RewardModelConfig | None = s.get("reward_model")
        problems.extend(
            placement_problems(
                resources,
                trainer,
                s.get("algorithm"),
                rm_enabled=rm_section is not None and rm_section.enable,
            )
        )
        mode = trainer.async_mode if trainer is not None else "off"
        if mode != "off" and resources.pool_of("rollout") == GLOBAL_POOL:
            msg = (
                f"{mode!r} needs the rollout on a pool of its own; set "
                'resources.placement.rollout = "NAME" and [resources.pools.NAME]'
            )
            problems.append((("trainer", "async_mode"), msg))
    rollout: RolloutConfig | None = s.get("rollout")
    async_mode = trainer.async_mode if trainer is not None else "off"
    if rollout is not None and rollout.partial_rollouts and async_mode == "off":
        msg = (
            "partial rollouts continue a batch across a weight sync, which only the "
            'asynchronous modes have; set trainer.async_mode = "one_step_off" or "fully_async"'
        )
        problems.append((("rollout", "partial_rollouts"), msg))
    elif rollout is not None and rollout.partial_rollouts and agent is not None:
        msg = (
            "an [agent] run's turns (generate_one) are not continued across a weight sync; "
            "set rollout.partial_rollouts = false"
        )
        problems.append((("rollout", "partial_rollouts"), msg))
    reward: RewardConfig | None = s.get("reward")
    rm: RewardModelConfig | None = s.get("reward_model")
    rm_on = rm is not None and rm.enable
    if rm_on and rm is not None and not rm.model.path:
        msg = "reward_model.enable is true: set it to the reward model's local folder"
        problems.append((("reward_model", "model", "path"), msg))
    if reward is not None:
        if not reward.selected() and not rm_on:
            msg = (
                'no reward selected; set reward.default = "NAME", map [reward.sources] '
                "or enable [reward_model]"
            )
            problems.append((("reward", "default"), msg))
        if RM_SCORER in reward.selected() or RM_SCORER in reward.weights:
            msg = (
                f"{RM_SCORER!r} is the reward model's scorer: set [reward_model] enable and "
                "weight instead"
            )
            key = "weights" if RM_SCORER in reward.weights else "default"
            problems.append((("reward", key), msg))
        for name in reward.weights:
            if name not in reward.selected():
                msg = f"reward {name!r} is not selected by reward.default or reward.sources"
                problems.append((("reward", "weights", name), msg))
    return problems
