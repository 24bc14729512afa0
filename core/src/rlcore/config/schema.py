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

from typing import Any, Literal

import attrs
from attrs import validators as v

from rlcore.config.agent_section import BUILTIN_TOOL_TURNS as BUILTIN_TOOL_TURNS
from rlcore.config.agent_section import AgentConfig
from rlcore.config.fields import (
    _FLATTEN,
    _MAX_TOKENS_HELP,
    _MICRO_HELP,
    RESOLVED,
    _finite,
    _nonempty,
    _opt_pos,
    _pos,
)
from rlcore.config.resources_section import COLOCATED_ROLES as COLOCATED_ROLES
from rlcore.config.resources_section import DEFAULT_CALL_TIMEOUT_S as DEFAULT_CALL_TIMEOUT_S
from rlcore.config.resources_section import (
    DEFAULT_COLLECTIVE_TIMEOUT_S as DEFAULT_COLLECTIVE_TIMEOUT_S,
)
from rlcore.config.resources_section import (
    DEFAULT_HEARTBEAT_TIMEOUT_S as DEFAULT_HEARTBEAT_TIMEOUT_S,
)
from rlcore.config.resources_section import (
    DEFAULT_PLACEMENT_TIMEOUT_S as DEFAULT_PLACEMENT_TIMEOUT_S,
)
from rlcore.config.resources_section import DEFAULT_START_TIMEOUT_S as DEFAULT_START_TIMEOUT_S
from rlcore.config.resources_section import (
    DEFAULT_WEIGHT_SYNC_BUCKET_BYTES as DEFAULT_WEIGHT_SYNC_BUCKET_BYTES,
)
from rlcore.config.resources_section import GLOBAL_POOL as GLOBAL_POOL
from rlcore.config.resources_section import PLACEABLE_ROLES as PLACEABLE_ROLES
from rlcore.config.resources_section import PoolConfig, ResourcesConfig
from rlcore.config.trainer_section import TrainerConfig
from rlcore.interfaces import (
    DTYPE_NAMES,
    Dtype,
    OptimConfig,
    SamplingParams,
    key,
)
from rlcore.interfaces.config_key import check_seconds
from rlcore.interfaces.reward import BATCH_REWARD_TIMEOUT, REWARD_TIMEOUT
from rlcore.tracking.loggers import LOGGERS

__all__ = [
    "LOGGERS",
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "ColumnsConfig",
    "CriticConfig",
    "DataConfig",
    "ModelConfig",
    "PluginSection",
    "PluginsConfig",
    "PoolConfig",
    "RefConfig",
    "ResourcesConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RoleConfig",
    "RoleModelConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainerConfig",
    "ValSamplingConfig",
    "check_seconds",
]


@attrs.frozen(kw_only=True)
class PluginSection:
    """A plugin choice: ``name`` plus an instance of that plugin's ``Config`` (``options``)."""

    name: str = key(
        help="The engine plugin that trains or scores this model (`rlcore plugins`).",
        validator=_nonempty,
    )
    options: Any = attrs.field(default=None, metadata=_FLATTEN)


@attrs.frozen(kw_only=True)
class ColumnsConfig:
    """``[data.columns]``: rows without verl's columns (a Hub data set as published) mapped
    onto them; unset keys leave the row's own columns."""

    prompt: str | None = key(
        None, "Column holding the prompt (text, or chat messages), read as data.prompt_key."
    )
    ground_truth: str | None = key(
        None, "Column holding the answer, read as reward_model.ground_truth."
    )
    data_source: str | None = key(
        None,
        "data_source of every row (names its reward and metrics); unset: the "
        "row's own data_source column.",
    )

    def active(self) -> bool:
        return any(v is not None for v in (self.prompt, self.ground_truth, self.data_source))


@attrs.frozen(kw_only=True)
class DataConfig:
    """``[data]``: prompt files and batch sizes (in prompts, before ``rollout.n``)."""

    train_files: tuple[str, ...] = key(
        help="Training prompts: .parquet or .jsonl files, concatenated in order, or Hub "
        'data sets "org/name[@revision][:split]" (split default train; e.g. '
        '"openai/gsm8k:main/train"), read from the Hugging Face cache.',
        validator=_nonempty,
    )
    val_files: tuple[str, ...] = key(
        (),
        "Validation prompts (.parquet/.jsonl, or a Hub data set, split default test); empty: "
        "no validation.",
    )
    columns: ColumnsConfig = key(
        factory=lambda: ColumnsConfig(),
        help="Map a data set's own columns onto rlcore's row (see [data.columns]).",
    )
    prompt_key: str = key(
        "prompt",
        "The column holding each prompt: chat messages ([{role, content}]) or a "
        "string (one user message when apply_chat_template).",
    )
    apply_chat_template: bool = key(
        True,
        "Render prompts with the tokenizer's chat template (the tokenizer must "
        "have one); false: string prompts are tokenized as they are.",
    )
    max_prompt_length: int = key(
        512, "Longest prompt in tokens, after the chat template.", validator=_pos
    )
    max_response_length: int = key(
        512,
        "Most tokens generated per response (all turns together in an agent run).",
        validator=_pos,
    )
    train_batch_size: int = key(
        8,
        "Prompts per training step (before rollout.n); the last partial batch of "
        "an epoch is dropped.",
        validator=_pos,
    )
    val_batch_size: int | None = key(
        None,
        "Prompts per validation batch; unset: the whole validation set at once.",
        validator=_opt_pos,
    )
    val_max_samples: int | None = key(
        None,
        "Keep only the first N validation prompts (after filtering); unset: all.",
        validator=_opt_pos,
    )
    shuffle: bool = key(True, "Shuffle the training prompts every epoch (seeded by data.seed).")
    seed: int = key(0, "Seed of the training prompts' shuffle, in [0, 2**32).")
    filter_overlong_prompts: bool = key(
        True,
        "Drop prompts longer than max_prompt_length (the count is logged); false: "
        "truncation decides.",
    )
    truncation: Literal["error", "left", "right"] = key(
        "error",
        "An over-long prompt kept by filter_overlong_prompts = false: error stops, "
        "left keeps its end, right keeps its start.",
        validator=v.in_(("error", "left", "right")),
    )


@attrs.frozen(kw_only=True)
class ModelConfig:
    """``[model]``: the policy's local Hugging Face folder."""

    path: str = key(
        help="The policy: a local Hugging Face folder (config, weights, tokenizer), a "
        'Hub name "org/name" resolved through the Hugging Face cache (HF_HOME; nothing is '
        "downloaded with HF_HUB_OFFLINE=1), or a GGUF file (a .gguf path, or "
        '"dist:DISTRIBUTION[/FILE]" for one shipped in an installed package) converted once '
        "into a cached HF folder under RLCORE_CACHE_DIR (every model path takes these).",
        validator=_nonempty,
    )
    revision: str | None = key(
        None,
        "Hub revision (branch, tag or commit) of a model.path given as a Hub name; unset: main.",
    )
    tokenizer_path: str = key(RESOLVED, "Folder of the tokenizer.", shown_default="model.path")
    dtype: Dtype = key(
        "float32",
        "Compute dtype of the policy's engines (ref and rollout follow it unless "
        "they set their own).",
        validator=v.in_(DTYPE_NAMES),
    )
    trust_remote_code: bool = key(
        False, "Allow the model folder's own Python code (transformers' flag)."
    )


@attrs.frozen(kw_only=True)
class ActorConfig:
    """``[actor]``: PPO-style updates of the policy. Mini-batches count prompts (verl)."""

    engine: PluginSection = attrs.Factory(lambda: PluginSection(name="fsdp2"))
    optim: OptimConfig = attrs.Factory(OptimConfig)
    ppo_mini_batch_size: int = key(
        RESOLVED,
        "Prompts per optimizer step (each with its rollout.n responses); a step's "
        "batch is split into mini-batches of this size.",
        validator=_opt_pos,
        shown_default="data.train_batch_size",
    )
    micro_batch_size: int | None = key(None, _MICRO_HELP, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = key(None, _MAX_TOKENS_HELP, validator=_opt_pos)
    ppo_epochs: int = key(1, "Passes over each step's batch (verl's ppo_epochs).", validator=_pos)
    grad_clip: float = key(
        1.0,
        "Clip the global gradient norm to this before each optimizer step.",
        validator=v.gt(0.0),
    )
    gradient_checkpointing: bool = key(
        False, "Recompute activations in the backward pass: less memory, slower."
    )
    compile: bool = key(
        False,
        "Compile the update's forward and backward with torch.compile (verl's "
        "use_torch_compile; engines that support it: fsdp2). Micro-batches are padded to "
        "bucketed shapes, so it compiles at most (prompt buckets) x (response buckets) "
        "x (row buckets) times: lengths round up to a power of two >= 16, capped at "
        "data.max_prompt_length / data.max_response_length; rows to micro_batch_size (or a "
        "power of two under max_tokens_per_micro_batch). Each compile is reported "
        "(perf/compile_s/<role>) with its break-even step count.",
    )
    shuffle: bool = key(False, "Reshuffle each rank's rows into new mini-batches every ppo_epoch.")
    reuse_on_policy_log_probs: bool = key(
        True,
        "On-policy updates (1 epoch, 1 mini-batch, no KL in the reward) take "
        "old_log_probs from the training forward instead of a separate pass; false: "
        "always run the pass.",
    )
    skip_zero_advantage_rows: bool = key(
        True,
        "Leave rows with all-zero advantages out of the backward pass when the "
        "loss ignores them (no KL loss, no entropy bonus); the gradient is unchanged.",
    )
    balance_tokens: bool = key(
        True,
        "With several data-parallel ranks, give each about the same tokens of "
        "every mini-batch (actor and critic updates; with skip_zero_advantage_rows, "
        "of the rows the actor trains); false: contiguous rows.",
    )


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

    n: int = key(
        1, "Responses per validation prompt (each prompt repeated n times).", validator=_pos
    )
    temperature: float = key(
        0.0, "Validation sampling temperature (used when do_sample).", validator=v.ge(0.0)
    )
    top_p: float = key(
        1.0,
        "Validation nucleus sampling: keep the smallest set of this mass.",
        validator=[v.gt(0.0), v.le(1.0)],
    )
    top_k: int = key(-1, "Validation top-k sampling; -1: off.", validator=v.ge(-1))
    do_sample: bool = key(False, "Sample validation responses; false: greedy decoding.")

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        return _sampling(self, max_new_tokens, do_sample=self.do_sample)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """``[rollout]``: ``name``, the shared sampling keys, then the rollout plugin's options.

    ``n`` is read in one place, the driver, which repeats each prompt ``n`` times (same
    ``uid``) before dispatch; everyone downstream sees rows, not ``n``.

    ``log_prob_metrics``: ask the rollout for ``rollout_log_probs`` every training step and
    log ``rollout/logprob_diff_mean`` / ``_max`` against the engine's old log-probs
    (:mod:`rlcore.roles.mismatch`). Unset: on where the rollout declares its log-probs come
    for free (``BaseRollout.traits(...).cheap_log_probs``: vLLM, whose sampler has them),
    off otherwise (the HF rollout keeps every step's logits for them, B x R x vocab floats).
    An algorithm option ``rollout_is`` asks for them whatever this says.
    """

    name: str = key(
        "hf", "The rollout plugin that generates responses (`rlcore plugins`).", validator=_nonempty
    )
    n: int = key(
        1,
        "Responses per training prompt: the driver repeats each prompt n times "
        "(one group, same uid) before generation.",
        validator=_pos,
    )
    temperature: float = key(1.0, "Training sampling temperature.", validator=v.ge(0.0))
    top_p: float = key(
        1.0,
        "Training nucleus sampling: keep the smallest set of this mass.",
        validator=[v.gt(0.0), v.le(1.0)],
    )
    top_k: int = key(-1, "Training top-k sampling; -1: off.", validator=v.ge(-1))
    log_prob_metrics: bool | None = key(
        None,
        "Ask the rollout for its log-probs every step and log "
        "rollout/logprob_diff_mean/_max against the trainer's; unset: on where the "
        "rollout's log-probs are cheap (vLLM), off otherwise.",
    )
    # Off by default: it changes what a sample is (tokens of several weight versions, the
    # row's version its oldest token's) and needs an engine that can take a sync mid-batch.
    partial_rollouts: bool = key(
        False,
        "With trainer.async_mode: a weight sync no longer waits for the batch generating; "
        "the rollout aborts its requests, keeps their tokens and continues them with the new "
        "weights (batch token_weight_versions; a row's weight_version is its oldest "
        "token's). vLLM with async_engine only (the HF rollout finishes its batch); not with "
        "[agent].",
    )
    val: ValSamplingConfig = attrs.Factory(ValSamplingConfig)
    options: Any = attrs.field(default=None, metadata=_FLATTEN)

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        """Training-time sampling (``do_sample=True``)."""
        return _sampling(self, max_new_tokens, do_sample=True)


@attrs.frozen(kw_only=True)
class RefConfig:
    """``[ref]``: the frozen reference policy (used when the algorithm needs KL)."""

    engine: PluginSection = attrs.field(default=RESOLVED, metadata={"default": "actor.engine"})
    micro_batch_size: int | None = key(None, _MICRO_HELP, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = key(None, _MAX_TOKENS_HELP, validator=_opt_pos)


@attrs.frozen(kw_only=True)
class CriticConfig:
    """``[critic]``: the value model (used when the algorithm needs a critic, e.g. PPO)."""

    model_path: str = key(
        RESOLVED,
        "Hugging Face folder the critic starts from (a value head is added).",
        shown_default="model.path",
    )
    engine: PluginSection = attrs.field(default=RESOLVED, metadata={"default": "actor.engine"})
    optim: OptimConfig = attrs.Factory(lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int = key(
        RESOLVED,
        "Prompts per critic optimizer step.",
        validator=_opt_pos,
        shown_default="actor.ppo_mini_batch_size",
    )
    micro_batch_size: int | None = key(None, _MICRO_HELP, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = key(None, _MAX_TOKENS_HELP, validator=_opt_pos)
    ppo_epochs: int = key(
        RESOLVED,
        "Passes of the critic over each step's batch.",
        validator=_opt_pos,
        shown_default="actor.ppo_epochs",
    )
    grad_clip: float = key(
        1.0, "Clip the critic's global gradient norm to this before each step.", validator=v.gt(0.0)
    )
    gradient_checkpointing: bool = key(
        False, "Recompute the critic's activations in the backward pass."
    )
    compile: bool = key(
        False,
        "Compile the critic's update with torch.compile, shapes bucketed as actor.compile's.",
    )


@attrs.frozen(kw_only=True)
class RoleModelConfig:
    """``[roles.<name>.model]``: the extra role's own Hugging Face folder."""

    path: str = key(
        "",
        "The role's local Hugging Face folder; required when the algorithm "
        "declares the role (checked before Ray starts).",
    )
    dtype: Dtype | None = key(
        None,
        "Compute dtype of the role's engine.",
        validator=v.optional(v.in_(("float32", "bfloat16", "float16"))),
        shown_default="model.dtype",
    )
    trust_remote_code: bool = key(False, "Allow the role's model folder's own Python code.")


@attrs.frozen(kw_only=True)
class RoleConfig:
    """``[roles.<name>]``: an extra role an algorithm declares (``BaseAlgorithm.extra_roles``),
    e.g. a distillation teacher: its model and engine, placed and checkpointed like ``[ref]``."""

    model: RoleModelConfig = attrs.Factory(RoleModelConfig)
    engine: PluginSection = attrs.field(default=RESOLVED, metadata={"default": "actor.engine"})
    micro_batch_size: int | None = key(None, _MICRO_HELP, validator=_opt_pos)
    max_tokens_per_micro_batch: int | None = key(None, _MAX_TOKENS_HELP, validator=_opt_pos)


@attrs.frozen(kw_only=True)
class RewardModelModelConfig(RoleModelConfig):
    """``[reward_model.model]``: the reward model's own Hugging Face folder."""

    path: str = key(
        "",
        "The reward model's local Hugging Face folder: a ...ForSequenceClassification "
        "with num_labels = 1 and its tokenizer; required with enable (checked before Ray "
        "starts).",
    )


@attrs.frozen(kw_only=True)
class RewardModelConfig:
    """``[reward_model]``: a sequence-classification reward model (verl's ``reward_model``),
    served by a training engine's forward in its own role (``rm``) beside the policy.

    Called each step as ``compute_rm_score`` (phase ``rm``); its score, placed on the last
    response token, is the scorer ``rm`` of the reward manager, mixed with ``[reward]``'s
    scorers by ``weight``. Frozen: a checkpoint keeps only which model it was, a resume
    rebuilds it from ``model.path``.
    """

    enable: bool = key(False, "Score every row with the reward model (role rm, scorer rm).")
    model: RewardModelModelConfig = attrs.Factory(RewardModelModelConfig)
    engine: PluginSection = attrs.field(default=RESOLVED, metadata={"default": "actor.engine"})
    micro_batch_size: int | None = key(
        None,
        "Rows per data-parallel rank in one reward-model forward; neither this "
        "nor max_tokens_per_micro_batch set: the actor's setting.",
        validator=_opt_pos,
    )
    max_tokens_per_micro_batch: int | None = key(None, _MAX_TOKENS_HELP, validator=_opt_pos)
    weight: float = key(
        1.0,
        "Weight of the reward model's score (scorer rm) in a row's reward, beside "
        "[reward] weights; 0 logs it without training on it.",
        validator=_finite,
        allowed="finite",
    )
    retokenize: Literal["auto", "always", "never"] = key(
        "auto",
        "Decode prompt + response and encode them with the reward model's "
        "tokenizer (and chat template, as verl does): auto: when its tokenizer differs "
        "from the policy's; never: score the policy's token ids as they are.",
        validator=v.in_(("auto", "always", "never")),
    )
    max_length: int | None = key(
        None,
        "Most tokens of one re-tokenised row; longer rows keep their last "
        "max_length tokens (the response end the score is read at). None: no limit.",
        validator=_opt_pos,
    )
    threshold: float = key(
        0.0,
        "The reward model's verdict is score > threshold; reward/rm/disagree_rule "
        "counts the rows where it differs from a rule reward's acc.",
        validator=_finite,
        allowed="finite",
    )


@attrs.frozen(kw_only=True)
class RewardConfig:
    """``[reward]``: which reward plugin(s) score which ``data_source``.

    ``sources`` maps a data source to reward names; others use ``default``. Several names
    are combined by ``weights`` (1.0 each unless given), per-sample and batched scorers alike.
    ``options`` holds, for every selected reward (and any given a ``[reward.options.NAME]``
    table), that plugin's ``Config``. ``timeout_s`` bounds one per-sample call (past it the
    row scores 0), ``batch_timeout_s`` one batched scorer's call (past it the run stops with
    an error naming the scorer; 900 s unless set).
    """

    default: tuple[str, ...] = key(
        (),
        "Reward plugin(s) for rows whose data_source is not in reward.sources "
        '(a name or a list, e.g. "gsm8k").',
    )
    sources: dict[str, tuple[str, ...]] = key(
        factory=dict, help="data_source -> reward name(s) for those rows."
    )
    weights: dict[str, float] = key(
        factory=dict,
        help="Reward name -> weight; a row scored by several rewards gets the weighted "
        "sum (1.0 each unless given).",
    )
    timeout_s: float = key(
        5.0,
        "Time limit of one reward call in seconds; past it the response scores 0 and is counted.",
        validator=REWARD_TIMEOUT,
    )
    batch_timeout_s: float | None = key(
        900.0,
        "Wall-clock limit in seconds of one batched scorer's call (BaseBatchReward, "
        "scored in the driver); past it the run stops naming the scorer. None: no limit.",
        validator=v.optional(BATCH_REWARD_TIMEOUT),
    )
    num_workers: int = key(
        0,
        "Scoring processes; 0: one per CPU (at most 8); 1: score in the driver.",
        validator=v.ge(0),
    )
    options: dict[str, Any] = key(
        factory=dict,
        help="[reward.options.NAME]: each reward plugin's own options (listed per plugin below).",
    )

    def selected(self) -> tuple[str, ...]:
        """Every reward name selected by ``default`` or ``sources``, first use first."""
        names = list(self.default) + [n for ns in self.sources.values() for n in ns]
        return tuple(dict.fromkeys(names))


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """``[algorithm]``: ``name``, then the algorithm plugin's options."""

    name: str = key(
        "grpo",
        "The algorithm plugin (advantages and losses; `rlcore plugins`).",
        validator=_nonempty,
    )
    options: Any = attrs.field(default=None, metadata=_FLATTEN)


@attrs.frozen(kw_only=True)
class PluginsConfig:
    """``[plugins]``: ``disabled`` distribution or entry-point names (``"*"``: all) are skipped
    before they are imported, in the driver and in every worker (e.g. a broken plugin)."""

    disabled: tuple[str, ...] = key(
        (),
        'Plugin distributions or entry points not loaded ("*": all), in the driver '
        "and every worker.",
    )


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
    reward_model: RewardModelConfig = attrs.Factory(RewardModelConfig)
