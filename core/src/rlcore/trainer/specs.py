"""One spec per role, built on the driver from the run config: what each worker gets.

The spec values themselves live with the workers that receive them (:mod:`rlcore.roles.specs`);
this module is the driver's half: :class:`RunSpecs` and the builders.

Workers never read the run config. The driver reads each setting once, here, and hands every
role exactly what it uses: the components to build (:class:`rlcore.plugins.Component`),
their :class:`~rlcore.interfaces.EngineSpec`/:class:`~rlcore.interfaces.RolloutSpec`, the
update plan (:class:`UpdateSpec`) and the two arguments of every forward pass (temperature,
entropy with gradient). ``rollout.n`` is read here too, for the driver only: it repeats the
prompts; the workers see rows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.engine.device import process_group_backend
from rlcore.errors import ConfigError
from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.plugins import Component
from rlcore.roles.specs import (
    AgentSpec,
    CriticSpec,
    EngineRole,
    GenerationRoleSpec,
    PolicySpec,
    RewardModelSpec,
    RoleSpec,
    RolloutWorkerSpec,
    UpdateSpec,
)
from rlcore.trainer.async_queue import AsyncSpec, async_spec
from rlcore.workers.worker import WorkerSettings

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rlcore.config import RunConfig
    from rlcore.config.schema import RewardModelConfig, RoleConfig
    from rlcore.interfaces import (
        AlgorithmNeeds,
        BaseAlgorithm,
        BaseRollout,
        ExtraRole,
        GenerationRole,
        RolloutTraits,
    )
    from rlcore.plugins import PluginRegistry

__all__ = [
    "RunSpecs",
    "build_generation_role_specs",
    "build_reward_model_spec",
    "build_role_specs",
    "build_specs",
    "rollout_traits",
    "worker_settings",
]


def _frozen_engine(
    config: RunConfig,
    section: RoleConfig | RewardModelConfig,
    role: str,
    where: str,
    registry: PluginRegistry | None,
    *,
    reward_head: bool = False,
) -> EngineRole:
    """The engine of a frozen model with a section of its own (``[roles.<name>]``,
    ``[reward_model]``): its ``model`` folder (dtype: ``model.dtype`` unless set), its
    engine plugin and micro-batching, no optimizer."""
    model = section.model
    return EngineRole(
        engine=Component.of("engine", section.engine, where=where).pinned(registry),
        spec=EngineSpec(
            role=role,
            model_path=model.path,
            optim=None,
            micro_batch_size=section.micro_batch_size,
            max_tokens_per_micro_batch=section.max_tokens_per_micro_batch,
            dtype=model.dtype or config.model.dtype,
            trust_remote_code=model.trust_remote_code,
            device=config.resources.device,
            seed=config.trainer.seed,
            reward_head=reward_head,
        ),
    )


def build_role_specs(
    config: RunConfig,
    declared: Sequence[ExtraRole],
    *,
    temperature: float,
    settings: WorkerSettings,
    registry: PluginRegistry | None = None,
) -> dict[str, RoleSpec]:
    """The spec of each declared role, from its ``[roles.<name>]`` (checked already)."""
    res = config.resources
    specs: dict[str, RoleSpec] = {}
    for role in declared:
        section = config.roles[role.name]
        specs[role.name] = RoleSpec(
            name=role.name,
            output_key=role.output_key,
            backend=process_group_backend(res.device),
            # "ref": a frozen model to the engines (no optimizer, no LoRA adapters)
            engine=_frozen_engine(config, section, "ref", f"[roles.{role.name}.engine]", registry),
            temperature=temperature,
            settings=settings,
        )
    return specs


def build_reward_model_spec(
    config: RunConfig, *, settings: WorkerSettings, registry: PluginRegistry | None = None
) -> RewardModelSpec | None:
    """The reward-model role's spec, None unless ``[reward_model] enable``."""
    rm, res = config.reward_model, config.resources
    if not rm.enable:
        return None
    return RewardModelSpec(
        backend=process_group_backend(res.device),
        engine=_frozen_engine(
            config, rm, "rm", "[reward_model.engine]", registry, reward_head=True
        ),
        policy_tokenizer_path=config.model.tokenizer_path,
        policy_trust_remote_code=config.model.trust_remote_code,
        retokenize=rm.retokenize,
        max_length=rm.max_length,
        settings=settings,
    )


@attrs.frozen(kw_only=True)
class RunSpecs:
    """Everything the driver hands out, plus what it uses itself (``n``, sampling)."""

    policy: PolicySpec
    critic: CriticSpec | None
    n: int
    val_n: int
    train_sampling: SamplingParams
    val_sampling: SamplingParams
    # the algorithm's extra roles by name (rlcore.roles.extra_roles), each its own worker
    roles: dict[str, RoleSpec] = attrs.Factory(dict)
    # the rollout's worker group when it has a pool of its own (None: in the policy worker)
    rollout: RolloutWorkerSpec | None = None
    # trainer.async_mode with the rollout on its own pool (None: generate in the step)
    asynchronous: AsyncSpec | None = None
    # trainer.rollout_data_dir: each trained step's samples, one JSON line each
    rollout_data_dir: str | None = None
    # the batched rewards' generation roles (a judge; rlcore.roles.generation_roles), by
    # name, each placed beside the policy; set by run_training once the rewards are built
    generation_roles: dict[str, Any] = attrs.Factory(dict)
    # [reward_model] enable: the reward-model role (rlcore.roles.reward_model)
    reward_model: RewardModelSpec | None = None


def worker_settings(config: RunConfig) -> WorkerSettings:
    """The run's settings every worker process applies (and the driver, to itself)."""
    return WorkerSettings(
        collective_timeout_s=config.resources.collective_timeout_s,
        auto_padding=config.trainer.auto_padding,
        disabled_plugins=config.plugins.disabled,
    )


def _update(
    config: RunConfig,
    *,
    mini_prompts: int,
    epochs: int,
    optim: OptimConfig,
    total_steps: int,
) -> UpdateSpec:
    train = config.data.train_batch_size
    mini = min(mini_prompts, train)
    mini_batches = math.ceil(train / mini)
    return UpdateSpec(
        rows_per_mini_batch=mini * config.rollout.n,
        mini_batches=mini_batches,
        epochs=epochs,
        shuffle=config.actor.shuffle,
        seed=config.trainer.seed,
        optim=optim,
        schedule_steps=max(1, total_steps * mini_batches * epochs),
        balance_tokens=config.actor.balance_tokens,
    )


def _agent_spec(config: RunConfig, registry: PluginRegistry | None) -> AgentSpec | None:
    agent = config.agent
    if agent is None:
        return None
    tools = tuple(
        Component(
            kind="tool", name=name, options=agent.options.get(name), where="[agent] tools"
        ).pinned(registry)
        for name in agent.tools
    )
    picked = {
        kind: Component(
            kind=kind, name=name, options=agent.options.get(name), where=f"[agent] {kind}"
        ).pinned(registry)
        for kind, name in (("harness", agent.harness), ("environment", agent.environment))
        if name is not None
    }
    return AgentSpec(
        config=agent,
        tools=tools,
        harness=picked.get("harness"),
        environment=picked.get("environment"),
        tokenizer_path=config.model.tokenizer_path,
        trust_remote_code=config.model.trust_remote_code,
    )


def _wants_rollout_log_probs(
    config: RunConfig, needs: AlgorithmNeeds, traits: RolloutTraits
) -> bool:
    """Training rollouts return ``rollout_log_probs``: for the loss (``rollout_is``) or for
    the mismatch metrics (``rollout.log_prob_metrics``, see ``RolloutConfig``)."""
    if needs.rollout_log_probs:
        return True
    wanted = config.rollout.log_prob_metrics
    if wanted is None:
        return traits.cheap_log_probs
    return wanted


def _partial_rollouts(config: RunConfig, traits: RolloutTraits) -> bool:
    """``rollout.partial_rollouts``, refused in one line for a rollout that cannot take a
    weight sync mid-batch (the loader refuses it without an async mode)."""
    if config.rollout.partial_rollouts and not traits.partial_rollouts:
        msg = (
            f"rollout.partial_rollouts: rollout {config.rollout.name!r} finishes its batch "
            "before a weight sync (only vLLM with [rollout] async_engine = true continues "
            "requests across one); set rollout.partial_rollouts = false"
        )
        raise ConfigError(msg)
    return config.rollout.partial_rollouts


def rollout_traits(config: RunConfig, registry: PluginRegistry | None = None) -> RolloutTraits:
    """The selected rollout's declared traits (:meth:`BaseRollout.traits` of its class)."""
    rollout = config.rollout
    component = Component(
        kind="rollout", name=rollout.name, options=rollout.options, where="[rollout]"
    )
    cls: type[BaseRollout] = component.resolve(registry)
    options = rollout.options if rollout.options is not None else cls.Config()
    return cls.traits(options)


def build_specs(
    config: RunConfig,
    algorithm: BaseAlgorithm,
    total_steps: int,
    *,
    registry: PluginRegistry | None = None,
) -> RunSpecs:
    """The per-role specs of a run of ``total_steps`` training steps.

    What the algorithm and the rollout bring is read from their declarations only
    (``algorithm.needs``, the rollout class's ``traits``), the rollout class looked up in
    ``registry`` (None: the installed plugins). Components of in-process plugins of
    ``registry`` carry their class (:meth:`Component.pinned`): workers cannot look them up.
    """
    needs = algorithm.needs
    traits = rollout_traits(config, registry)
    model, actor, res = config.model, config.actor, config.resources
    backend = process_group_backend(res.device)
    settings = worker_settings(config)
    common: dict[str, Any] = {
        "dtype": model.dtype,
        "trust_remote_code": model.trust_remote_code,
        "device": res.device,
        "seed": config.trainer.seed,
    }
    # The shapes a compiled update pads micro-batches to are capped at these.
    lengths: dict[str, Any] = {
        "max_prompt_length": config.data.max_prompt_length,
        "max_response_length": config.data.max_response_length,
    }
    actor_update = _update(
        config,
        mini_prompts=actor.ppo_mini_batch_size,
        epochs=actor.ppo_epochs,
        optim=actor.optim,
        total_steps=total_steps,
    )
    actor_role = EngineRole(
        engine=Component.of("engine", actor.engine, where="[actor.engine]").pinned(registry),
        spec=EngineSpec(
            role="actor",
            model_path=model.path,
            optim=actor.optim,
            total_steps=actor_update.schedule_steps,
            grad_clip=actor.grad_clip,
            micro_batch_size=actor.micro_batch_size,
            max_tokens_per_micro_batch=actor.max_tokens_per_micro_batch,
            gradient_checkpointing=actor.gradient_checkpointing,
            compile=actor.compile,
            **lengths,
            **common,
        ),
    )
    ref_role = None
    if needs.reference:
        ref = config.ref
        ref_role = EngineRole(
            engine=Component.of("engine", ref.engine, where="[ref.engine]").pinned(registry),
            spec=EngineSpec(
                role="ref",
                model_path=model.path,
                optim=None,
                micro_batch_size=ref.micro_batch_size,
                max_tokens_per_micro_batch=ref.max_tokens_per_micro_batch,
                **common,
            ),
        )
    algo = Component(
        kind="algorithm",
        name=config.algorithm.name,
        options=config.algorithm.options,
        where="[algorithm]",
    ).pinned(registry)
    rollout = config.rollout
    rollout_pool = None if res.separate_rollout() is None else res.pool_of("rollout")
    policy = PolicySpec(
        rollout_pool=rollout_pool,
        weight_sync_bucket_bytes=res.weight_sync_bucket_bytes,
        backend=backend,
        settings=settings,
        actor=actor_role,
        ref=ref_role,
        rollout=Component(
            kind="rollout", name=rollout.name, options=rollout.options, where="[rollout]"
        ).pinned(registry),
        rollout_spec=RolloutSpec(
            model_path=model.path,
            max_prompt_length=config.data.max_prompt_length,
            max_response_length=config.data.max_response_length,
            partial_rollouts=_partial_rollouts(config, traits),
            **common,
        ),
        algorithm=algo,
        update=actor_update,
        # Log-probs of the distribution that was sampled: logits / temperature (greedy
        # training, temperature 0, scores the unscaled distribution).
        temperature=rollout.temperature or 1.0,
        with_entropy=needs.entropy,
        agent=_agent_spec(config, registry),
        reuse_old_log_probs=(
            actor.reuse_on_policy_log_probs
            and actor_update.epochs == 1
            and actor_update.mini_batches == 1
            and not needs.old_log_probs_on_driver
        ),
        skip_zero_advantage_rows=actor.skip_zero_advantage_rows and needs.zero_advantage_rows_inert,
    )
    critic_spec = None
    if needs.critic:
        critic = config.critic
        critic_update = _update(
            config,
            mini_prompts=critic.ppo_mini_batch_size,
            epochs=critic.ppo_epochs,
            optim=critic.optim,
            total_steps=total_steps,
        )
        critic_spec = CriticSpec(
            backend=backend,
            settings=settings,
            critic=EngineRole(
                engine=Component.of("engine", critic.engine, where="[critic.engine]").pinned(
                    registry
                ),
                spec=EngineSpec(
                    role="critic",
                    model_path=critic.model_path,
                    optim=critic.optim,
                    total_steps=critic_update.schedule_steps,
                    grad_clip=critic.grad_clip,
                    micro_batch_size=critic.micro_batch_size,
                    max_tokens_per_micro_batch=critic.max_tokens_per_micro_batch,
                    gradient_checkpointing=critic.gradient_checkpointing,
                    compile=critic.compile,
                    **lengths,
                    value_head=True,
                    **common,
                ),
            ),
            algorithm=algo,
            update=critic_update,
        )
    max_new = config.data.max_response_length
    train_sampling = attrs.evolve(
        rollout.sampling(max_new), return_log_probs=_wants_rollout_log_probs(config, needs, traits)
    )
    rollout_worker = None
    if rollout_pool is not None:
        rollout_worker = RolloutWorkerSpec(
            backend=backend,
            pool=rollout_pool,
            rollout=policy.rollout,
            rollout_spec=policy.rollout_spec,
            agent=policy.agent,
            settings=settings,
            weight_sync_bucket_bytes=res.weight_sync_bucket_bytes,
        )
    return RunSpecs(
        rollout=rollout_worker,
        asynchronous=async_spec(config.trainer) if rollout_worker is not None else None,
        rollout_data_dir=config.trainer.rollout_data_dir,
        policy=policy,
        critic=critic_spec,
        n=rollout.n,
        val_n=rollout.val.n,
        train_sampling=train_sampling,
        val_sampling=rollout.val.sampling(max_new),
        roles=build_role_specs(
            config,
            needs.extra_roles,
            temperature=policy.temperature,
            settings=settings,
            registry=registry,
        ),
        reward_model=build_reward_model_spec(config, settings=settings, registry=registry),
    )


def build_generation_role_specs(
    config: RunConfig,
    roles: Sequence[GenerationRole],
    *,
    settings: WorkerSettings,
    taken: Sequence[str] = (),
    registry: PluginRegistry | None = None,
) -> dict[str, GenerationRoleSpec]:
    """The spec of each declared role; a name used twice, or by another role (``taken``),
    is a :class:`ConfigError`."""
    res = config.resources
    specs: dict[str, GenerationRoleSpec] = {}
    for role in roles:
        if role.name in specs or role.name in taken:
            msg = (
                f"reward role {role.name!r}: the name is already taken (roles: "
                f"{', '.join([*taken, *specs])}); give the reward's role another name"
            )
            raise ConfigError(msg)
        where = f"reward role {role.name!r}"
        specs[role.name] = GenerationRoleSpec(
            name=role.name,
            backend=process_group_backend(res.device),
            rollout=Component(
                kind="rollout", name=role.rollout, options=role.rollout_options, where=where
            ).pinned(registry),
            rollout_spec=RolloutSpec(
                model_path=role.model_path,
                dtype=role.dtype or config.model.dtype,
                trust_remote_code=role.trust_remote_code,
                device=res.device,
                max_prompt_length=role.max_prompt_length,
                max_response_length=role.max_response_length,
                seed=config.trainer.seed,
            ),
            apply_chat_template=role.apply_chat_template,
            settings=settings,
        )
    return specs
