"""The defaults that depend on other keys (``model.tokenizer_path``: ``model.path``, the micro-batch
rule's one default, ...), filled in once a config has no error left."""

from __future__ import annotations

from typing import Any

import attrs

from rlcore.config.fields import ROLES
from rlcore.config.schema import (
    ActorConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    RefConfig,
    RewardConfig,
    RewardModelConfig,
    RunConfig,
    TrainerConfig,
)

# --- defaults that depend on other keys -------------------------------------------------------

# Tokens (prompt + response, padded) per micro-batch when neither micro-batch key is set: one
# micro-batch for the quickstart's 256 rows x ~60 tokens; on a GPU, a 7B model's activations
# with gradient checkpointing and its (tokens, vocab) logits fit in tens of GB.
DEFAULT_MAX_TOKENS_PER_MICRO_BATCH = 16384


def _micro_unset(cfg: Any) -> bool:
    return cfg.micro_batch_size is None and cfg.max_tokens_per_micro_batch is None


def _micro_or(cfg: Any, inherited: dict[str, Any]) -> dict[str, Any]:
    """A role's own micro-batching when it sets one, else the actor's."""
    return inherited if _micro_unset(cfg) else {}


def resolved_config(
    s: dict[str, Any], reward_configs: dict[str, Any], logger_configs: dict[str, Any]
) -> RunConfig:
    data: DataConfig = s["data"]
    model: ModelConfig = s["model"]
    actor: ActorConfig = s["actor"]
    # The micro-batch rule's one default, for the actor; ref and critic inherit the actor's.
    # Dynamic micro-batches: as many rows as fit the budget, instead of one row per
    # forward/backward (issue 16); set micro_batch_size for fixed counts.
    micro: dict[str, Any] = (
        {"micro_batch_size": None, "max_tokens_per_micro_batch": DEFAULT_MAX_TOKENS_PER_MICRO_BATCH}
        if _micro_unset(actor)
        else {
            "micro_batch_size": actor.micro_batch_size,
            "max_tokens_per_micro_batch": actor.max_tokens_per_micro_batch,
        }
    )
    actor = attrs.evolve(
        actor, ppo_mini_batch_size=actor.ppo_mini_batch_size or data.train_batch_size, **micro
    )
    ref: RefConfig = s["ref"]
    ref = attrs.evolve(ref, engine=ref.engine or actor.engine, **_micro_or(ref, micro))
    critic: CriticConfig = s["critic"]
    critic = attrs.evolve(
        critic,
        model_path=critic.model_path or model.path,
        engine=critic.engine or actor.engine,
        ppo_mini_batch_size=critic.ppo_mini_batch_size or actor.ppo_mini_batch_size,
        ppo_epochs=critic.ppo_epochs or actor.ppo_epochs,
        **_micro_or(critic, micro),
    )
    rm: RewardModelConfig = s["reward_model"]
    rm = attrs.evolve(
        rm,
        model=attrs.evolve(rm.model, dtype=rm.model.dtype or model.dtype),
        engine=rm.engine or actor.engine,
        **_micro_or(rm, micro),
    )
    reward: RewardConfig = s["reward"]
    weights = {name: reward.weights.get(name, 1.0) for name in reward.selected()}
    reward = attrs.evolve(reward, weights=weights, options=reward_configs)
    trainer: TrainerConfig = s["trainer"]
    trainer = attrs.evolve(
        trainer,
        total_epochs=1
        if trainer.total_steps is None and not trainer.total_epochs
        else trainer.total_epochs,
        run_dir=trainer.run_dir or f"runs/{trainer.experiment_name}",
        logger_options=logger_configs,
    )
    return RunConfig(
        data=data,
        model=attrs.evolve(model, tokenizer_path=model.tokenizer_path or model.path),
        actor=actor,
        rollout=s["rollout"],
        ref=ref,
        critic=critic,
        reward=reward,
        algorithm=s["algorithm"],
        trainer=trainer,
        resources=s["resources"],
        plugins=s["plugins"],
        agent=s["agent"],
        roles={
            name: attrs.evolve(
                role,
                model=attrs.evolve(role.model, dtype=role.model.dtype or model.dtype),
                engine=role.engine or actor.engine,
                **_micro_or(role, micro),
            )
            for name, role in s[ROLES].items()
        },
        reward_model=rm,
    )
