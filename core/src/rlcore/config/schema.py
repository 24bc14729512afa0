"""The attrs classes of a run's configuration, one per TOML section.

Plugin-selected sections (``[actor.engine]``, ``[rollout]``, ``[algorithm]``,
``[reward.options.NAME]``) keep the selected plugin's own ``Config`` instance in an
``options`` field; the loader builds it from the keys the core does not own. Fields marked
``RESOLVED`` default to a key whose value depends on other keys (``model.tokenizer_path``:
``model.path``); their type is the resolved one, because :func:`rlcore.config.load_config`
fills every one of them in before anyone reads the config (``None`` exists only inside the
loader).

Every knob of a run is a key here, timeouts and thread counts included
(``[resources] call_timeout_s``, ...); the ``rlcore`` command maps the ``RLCORE_*``
environment variables onto these keys (``rlcore.cli.ENV_KEYS``), nothing else reads them.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs
from attrs import validators as v

from rlcore.interfaces import DTYPE_NAMES, Device, Dtype, OptimConfig, SamplingParams
from rlcore.tracking.loggers import LOGGERS

__all__ = [
    "LOGGERS",
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "DataConfig",
    "ModelConfig",
    "PluginSection",
    "PluginsConfig",
    "PoolConfig",
    "RefConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RoleConfig",
    "RoleModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainerConfig",
    "ValSamplingConfig",
    "check_seconds",
]

# Merged into the parent table when dumped: the plugin's options sit next to ``name``.
_FLATTEN = {"flatten": True}

_pos = v.ge(1)
_opt_pos = v.optional(v.ge(1))

# The default of a field the loader resolves from other keys; typed ``Any`` so the field keeps
# its resolved type (``str``, not ``str | None``) for everyone who reads a loaded config.
RESOLVED: Any = None

# Bounds on every wait of a run ([resources] *_timeout_s), in seconds.
DEFAULT_CALL_TIMEOUT_S = 3600.0  # one worker-group call: a whole generate or update may be one
DEFAULT_START_TIMEOUT_S = 600.0  # a group's actors placed and their __init__ done
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0  # a pool's placement groups reserved by Ray
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # each torch.distributed collective in the workers
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0  # a worker's heartbeat still for this long: stopped


def check_seconds(key: str, value: Any) -> float:
    """``value`` as seconds, or ``ValueError`` in one line naming ``key``: the one rule for
    every timeout (config keys and the worker group's constructor arguments alike)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        shown = value if ok else repr(value)
        msg = f"{key} must be a finite number > 0, got {shown}"
        raise ValueError(msg)
    return float(value)


def _seconds(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
    try:
        check_seconds(attr.name, value)
    except ValueError as err:
        # The loader prefixes the section path: resources.call_timeout_s: must be ...
        raise ValueError(str(err).removeprefix(f"{attr.name} ")) from None


def _timeout(default: float) -> Any:
    return attrs.field(default=default, validator=_seconds)


def _nonempty(_inst: object, _attr: attrs.Attribute[Any], value: str | tuple[str, ...]) -> None:
    if not value:
        msg = "must not be empty"
        raise ValueError(msg)


def _loggers(_inst: object, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    # Which names exist is the plugin registry's to say (the loader checks each one).
    for name in value:
        if value.count(name) > 1:
            msg = f"logger {name!r} is listed twice"
            raise ValueError(msg)


@attrs.frozen(kw_only=True)
class PluginSection:
    """A plugin choice: ``name`` plus an instance of that plugin's ``Config`` (``options``)."""

    name: str = attrs.field(validator=_nonempty)
    options: Any = attrs.field(default=None, metadata=_FLATTEN)


@attrs.frozen(kw_only=True)
class DataConfig:
    """``[data]``: prompt files and batch sizes (in prompts, before ``rollout.n``)."""

    train_files: tuple[str, ...] = attrs.field(validator=_nonempty)
    val_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    apply_chat_template: bool = True
    max_prompt_length: int = attrs.field(default=512, validator=_pos)
    max_response_length: int = attrs.field(default=512, validator=_pos)
    train_batch_size: int = attrs.field(default=8, validator=_pos)
    val_batch_size: int | None = attrs.field(default=None, validator=_opt_pos)  # None: all
    val_max_samples: int | None = attrs.field(default=None, validator=_opt_pos)  # None: all
    shuffle: bool = True
    seed: int = 0
    filter_overlong_prompts: bool = True
    truncation: Literal["error", "left", "right"] = attrs.field(
        default="error", validator=v.in_(("error", "left", "right"))
    )


@attrs.frozen(kw_only=True)
class ModelConfig:
    """``[model]``: the policy's local Hugging Face folder."""

    path: str = attrs.field(validator=_nonempty)
    tokenizer_path: str = RESOLVED  # resolved: ``path``
    dtype: Dtype = attrs.field(default="float32", validator=v.in_(DTYPE_NAMES))
    trust_remote_code: bool = False


@attrs.frozen(kw_only=True)
class ActorConfig:
    """``[actor]``: PPO-style updates of the policy. Mini-batches count prompts (verl)."""

    engine: PluginSection = attrs.Factory(lambda: PluginSection(name="fsdp2"))
    optim: OptimConfig = attrs.Factory(OptimConfig)
    # resolved: data.train_batch_size
    ppo_mini_batch_size: int = attrs.field(default=RESOLVED, validator=_opt_pos)
    # Rows per data-parallel rank per micro-batch, or a token budget; resolved: exactly one set.
    micro_batch_size: int | None = attrs.field(default=None, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_opt_pos)
    ppo_epochs: int = attrs.field(default=1, validator=_pos)
    grad_clip: float = attrs.field(default=1.0, validator=v.gt(0.0))
    gradient_checkpointing: bool = False
    shuffle: bool = False
    # On-policy updates (1 epoch, 1 mini-batch, no KL in the reward) take old_log_probs from
    # the training forward instead of a separate pass; false always runs the pass.
    reuse_on_policy_log_probs: bool = True
    # Leave rows with all-zero advantages out of the backward pass when the loss ignores them
    # (no KL loss, no entropy bonus); the gradient is unchanged.
    skip_zero_advantage_rows: bool = True
    # With several data-parallel ranks, give each about the same tokens of every mini-batch
    # (actor and critic updates); false: contiguous rows.
    balance_tokens: bool = True


def _sampling(
    section: ValSamplingConfig | RolloutConfig, max_new_tokens: int, *, do_sample: bool
) -> SamplingParams:
    """The sampling keys ``[rollout]`` and ``[rollout.val]`` share, as one ``SamplingParams``."""
    return SamplingParams(
        temperature=section.temperature,
        top_p=section.top_p,
        top_k=section.top_k,
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
    )


@attrs.frozen(kw_only=True)
class ValSamplingConfig:
    """``[rollout.val]``: sampling for validation, greedy by default.

    ``n``: samples per validation prompt; the driver repeats each prompt ``n`` times.
    """

    n: int = attrs.field(default=1, validator=_pos)
    temperature: float = attrs.field(default=0.0, validator=v.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=[v.gt(0.0), v.le(1.0)])
    top_k: int = attrs.field(default=-1, validator=v.ge(-1))
    do_sample: bool = False

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        return _sampling(self, max_new_tokens, do_sample=self.do_sample)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """``[rollout]``: ``name``, the shared sampling keys, then the rollout plugin's options.

    ``n`` is read in one place, the driver, which repeats each prompt ``n`` times (same
    ``uid``) before dispatch; everyone downstream sees rows, not ``n``.

    ``log_prob_metrics``: ask the rollout for ``rollout_log_probs`` every training step and
    log ``rollout/logprob_diff_mean`` / ``_max`` against the engine's old log-probs
    (:mod:`rlcore.trainer.mismatch`). Unset: on where the rollout declares its log-probs come
    for free (``BaseRollout.traits(...).cheap_log_probs``: vLLM, whose sampler has them),
    off otherwise (the HF rollout keeps every step's logits for them, B x R x vocab floats).
    An algorithm option ``rollout_is`` asks for them whatever this says.
    """

    name: str = attrs.field(default="hf", validator=_nonempty)
    n: int = attrs.field(default=1, validator=_pos)
    temperature: float = attrs.field(default=1.0, validator=v.ge(0.0))
    top_p: float = attrs.field(default=1.0, validator=[v.gt(0.0), v.le(1.0)])
    top_k: int = attrs.field(default=-1, validator=v.ge(-1))  # -1: off
    log_prob_metrics: bool | None = None  # None: on where the rollout's log-probs are cheap
    val: ValSamplingConfig = attrs.Factory(ValSamplingConfig)
    options: Any = attrs.field(default=None, metadata=_FLATTEN)

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        """Training-time sampling (``do_sample=True``)."""
        return _sampling(self, max_new_tokens, do_sample=True)


@attrs.frozen(kw_only=True)
class RefConfig:
    """``[ref]``: the frozen reference policy (used when the algorithm needs KL)."""

    engine: PluginSection = RESOLVED  # resolved: the actor's engine, options included
    # resolved: the actor's micro-batching when neither is set
    micro_batch_size: int | None = attrs.field(default=None, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_opt_pos)


@attrs.frozen(kw_only=True)
class CriticConfig:
    """``[critic]``: the value model (used when the algorithm needs a critic, e.g. PPO)."""

    model_path: str = RESOLVED  # resolved: model.path
    engine: PluginSection = RESOLVED  # resolved: the actor's engine, options included
    optim: OptimConfig = attrs.Factory(lambda: OptimConfig(lr=1e-5))
    # resolved: actor.ppo_mini_batch_size
    ppo_mini_batch_size: int = attrs.field(default=RESOLVED, validator=_opt_pos)
    # resolved: the actor's micro-batching when neither is set
    micro_batch_size: int | None = attrs.field(default=None, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_opt_pos)
    ppo_epochs: int = attrs.field(default=RESOLVED, validator=_opt_pos)  # resolved: actor's
    grad_clip: float = attrs.field(default=1.0, validator=v.gt(0.0))
    gradient_checkpointing: bool = False


@attrs.frozen(kw_only=True)
class RoleModelConfig:
    """``[roles.<name>.model]``: the extra role's own Hugging Face folder."""

    path: str = ""  # required when the algorithm declares the role (checked before Ray)
    dtype: Dtype | None = attrs.field(  # None: model.dtype
        default=None, validator=v.optional(v.in_(("float32", "bfloat16", "float16")))
    )
    trust_remote_code: bool = False


@attrs.frozen(kw_only=True)
class RoleConfig:
    """``[roles.<name>]``: an extra role an algorithm declares (``BaseAlgorithm.extra_roles``),
    e.g. a distillation teacher: its model and engine, placed and checkpointed like ``[ref]``."""

    model: RoleModelConfig = attrs.Factory(RoleModelConfig)
    engine: PluginSection = RESOLVED  # resolved: the actor's engine, options included
    # resolved: the actor's micro-batching when neither is set
    micro_batch_size: int | None = attrs.field(default=None, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, validator=_opt_pos)


@attrs.frozen(kw_only=True)
class RewardConfig:
    """``[reward]``: which reward plugin(s) score which ``data_source``.

    ``sources`` maps a data source to reward names; others use ``default``. Several names
    are combined by ``weights`` (1.0 each unless given). ``options`` holds, for every selected
    reward (and any given a ``[reward.options.NAME]`` table), that plugin's ``Config``.
    """

    default: tuple[str, ...] = ()
    sources: dict[str, tuple[str, ...]] = attrs.Factory(dict)
    weights: dict[str, float] = attrs.Factory(dict)  # resolved: every selected name
    timeout_s: float = attrs.field(default=5.0, validator=v.gt(0.0))
    num_workers: int = attrs.field(default=0, validator=v.ge(0))  # 0: one per CPU
    options: dict[str, Any] = attrs.Factory(dict)

    def selected(self) -> tuple[str, ...]:
        """Every reward name selected by ``default`` or ``sources``, first use first."""
        names = list(self.default) + [n for ns in self.sources.values() for n in ns]
        return tuple(dict.fromkeys(names))


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """``[algorithm]``: ``name``, then the algorithm plugin's options."""

    name: str = attrs.field(default="grpo", validator=_nonempty)
    options: Any = attrs.field(default=None, metadata=_FLATTEN)


@attrs.frozen(kw_only=True)
class AgentConfig:
    """``[agent]``: multi-turn rollouts with tools (:mod:`rlcore.agent`); absent: single-turn.

    ``tools`` names tool plugins (``register_tools``). The response budget of a conversation,
    all turns together, is ``data.max_response_length``; ``max_turns`` counts model turns
    (verl's ``max_assistant_turns``). ``max_parallel_calls`` (calls run per turn) and
    ``max_tool_response_length`` (characters of a tool's answer kept) are verl's names;
    ``tool_parser`` is verl's ``format``.
    """

    tools: tuple[str, ...] = ()
    tool_parser: str = attrs.field(default="hermes", validator=v.in_(("hermes", "qwen")))
    max_turns: int = attrs.field(default=4, validator=_pos)
    max_tokens_per_turn: int | None = attrs.field(default=None, validator=_opt_pos)  # None: all
    max_parallel_calls: int = attrs.field(default=4, validator=_pos)
    max_parallel_conversations: int = attrs.field(default=256, validator=_pos)
    tool_timeout_s: float = attrs.field(default=5.0, validator=v.gt(0.0))
    generation_timeout_s: float = attrs.field(default=600.0, validator=v.gt(0.0))
    max_tool_response_length: int = attrs.field(default=1000, validator=_pos)


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """``[trainer]``: length, validation, checkpoints, logging."""

    total_steps: int | None = attrs.field(default=None, validator=_opt_pos)
    total_epochs: int | None = attrs.field(default=None, validator=_opt_pos)  # resolved: 1
    test_freq: int = attrs.field(default=0, validator=v.ge(0))  # 0: no periodic validation
    val_before_train: bool = True
    save_freq: int = attrs.field(default=0, validator=v.ge(0))  # 0: only at the end
    resume: str = attrs.field(default="auto", validator=_nonempty)  # "auto" | "off" | PATH
    keep_last: int | None = attrs.field(default=None, validator=_opt_pos)  # None: keep all
    export_final: bool = True  # the final actor as a Hugging Face folder: <run_dir>/final_hf
    # Consecutive steps with a non-finite loss or gradient (each skipped) before the run stops.
    max_consecutive_nonfinite: int = attrs.field(default=3, validator=_pos)
    # Divergence guard: a step whose actor or critic gradient norm (before clipping) exceeds
    # this stops the run unsaved (rlcore.trainer.divergence); None: no ceiling.
    grad_norm_ceiling: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    # DataProtoConfig.auto_padding in the driver and every worker: chunk() may split a batch
    # unevenly (verl's VERL_AUTO_PADDING, which still works on its own).
    auto_padding: bool = False
    experiment_name: str = attrs.field(default="rlcore", validator=_nonempty)
    run_dir: str = RESOLVED  # resolved: runs/<experiment_name>
    seed: int = 0
    # Logger plugins: the core's console, jsonl, tensorboard; rlcore-wandb, rlcore-mlflow, ...
    loggers: tuple[str, ...] = attrs.field(default=("console", "jsonl"), validator=_loggers)
    # Each selected logger's Config, from [trainer.logger_options.NAME] (resolved: every one).
    logger_options: dict[str, Any] = attrs.Factory(dict)
    log_freq: int = attrs.field(default=1, validator=_pos)  # console table every N steps
    # "one_step_off": the rollout (on a pool of its own) generates batch k+1 while the trainer
    # trains on batch k; samples are then one weight version old (docs/placement.md).
    async_mode: Literal["off", "one_step_off"] = attrs.field(
        default="off", validator=v.in_(("off", "one_step_off"))
    )


# The implicit pool of ``resources.nnodes × processes_per_node`` (verl's name for it).
GLOBAL_POOL = "global_pool"
# Roles that ``resources.placement`` may put on a pool of their own (docs/placement.md).
PLACEABLE_ROLES = ("rollout",)
DEFAULT_WEIGHT_SYNC_BUCKET_BYTES = 64 << 20  # 64 MiB per broadcast across pools


@attrs.frozen(kw_only=True)
class PoolConfig:
    """``[resources.pools.<name>]``: a resource pool besides the implicit ``global_pool``.

    ``cpus_per_process`` unset: the top-level ``resources.cpus_per_process``.
    """

    nnodes: int = attrs.field(default=1, validator=_pos)
    processes_per_node: int = attrs.field(default=1, validator=_pos)
    cpus_per_process: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))

    @property
    def world_size(self) -> int:
        return self.nnodes * self.processes_per_node


@attrs.frozen(kw_only=True)
class ResourcesConfig:
    """``[resources]``: where workers run. Data-parallel size = nnodes × processes_per_node.

    The top-level ``nnodes``/``processes_per_node`` are the implicit pool ``global_pool``,
    which every role shares by default (colocated). ``pools`` declares more pools and
    ``placement`` maps a role to one, as verl's ``resource_pool_spec`` and ``mapping``:
    ``placement = { rollout = "gen" }`` gives the rollout a worker group of its own on
    ``[resources.pools.gen]``; the trainer's weights reach it after every update over a
    collective group spanning both pools, in buckets of ``weight_sync_bucket_bytes``.
    """

    device: Device = attrs.field(default="cpu", validator=v.in_(("cpu", "cuda")))
    nnodes: int = attrs.field(default=1, validator=_pos)
    processes_per_node: int = attrs.field(default=1, validator=_pos)
    ray_address: str | None = None  # None: RAY_ADDRESS, else a local Ray
    # Each worker's torch threads follow its CPU share: floor(cpus_per_process), at least 1.
    cpus_per_process: float = attrs.field(default=1.0, validator=v.gt(0.0))
    # Torch threads of the driver process (it scores rewards and advantages).
    driver_num_threads: int = attrs.field(default=1, validator=_pos)
    # Every wait is bounded (seconds): a worker-group call, a group's start, a pool's
    # placement, a collective inside the workers, a worker's heartbeat.
    call_timeout_s: float = _timeout(DEFAULT_CALL_TIMEOUT_S)
    start_timeout_s: float = _timeout(DEFAULT_START_TIMEOUT_S)
    placement_timeout_s: float = _timeout(DEFAULT_PLACEMENT_TIMEOUT_S)
    collective_timeout_s: float = _timeout(DEFAULT_COLLECTIVE_TIMEOUT_S)
    heartbeat_timeout_s: float = _timeout(DEFAULT_HEARTBEAT_TIMEOUT_S)
    pools: dict[str, PoolConfig] = attrs.Factory(dict)
    placement: dict[str, str] = attrs.Factory(dict)  # role -> pool; unmapped: global_pool
    weight_sync_bucket_bytes: int = attrs.field(
        default=DEFAULT_WEIGHT_SYNC_BUCKET_BYTES, validator=_pos
    )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.processes_per_node

    def pool_of(self, role: str) -> str:
        """The pool ``role`` is placed on (``global_pool`` unless ``placement`` says)."""
        return self.placement.get(role, GLOBAL_POOL)

    def separate_rollout(self) -> PoolConfig | None:
        """The rollout's own pool, or None when it is colocated with the actor (default)."""
        name = self.pool_of("rollout")
        return None if name == GLOBAL_POOL else self.pools.get(name)


@attrs.frozen(kw_only=True)
class PluginsConfig:
    """``[plugins]``: ``disabled`` distribution or entry-point names (``"*"``: all) are skipped
    before they are imported, in the driver and in every worker (e.g. a broken plugin)."""

    disabled: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RunConfig:
    """A whole run, as :func:`rlcore.config.load_config` returns it (defaults resolved)."""

    data: DataConfig
    model: ModelConfig
    actor: ActorConfig = attrs.Factory(ActorConfig)
    rollout: RolloutConfig = attrs.Factory(RolloutConfig)
    ref: RefConfig = attrs.Factory(RefConfig)
    critic: CriticConfig = attrs.Factory(CriticConfig)
    reward: RewardConfig = attrs.Factory(RewardConfig)
    algorithm: AlgorithmConfig = attrs.Factory(AlgorithmConfig)
    trainer: TrainerConfig = attrs.Factory(TrainerConfig)
    resources: ResourcesConfig = attrs.Factory(ResourcesConfig)
    plugins: PluginsConfig = attrs.Factory(PluginsConfig)
    agent: AgentConfig | None = None  # None: no [agent] section, single-turn generation
    roles: dict[str, RoleConfig] = attrs.Factory(dict)  # [roles.<name>]: extra roles
