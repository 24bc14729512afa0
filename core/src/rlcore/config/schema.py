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
from typing import Any, Final, Literal

import attrs
from attrs import validators as v

from rlcore.interfaces import (
    DTYPE_NAMES,
    POLL_MAX_S,
    Device,
    Dtype,
    OptimConfig,
    SamplingParams,
    key,
    seconds,
)
from rlcore.interfaces.config_key import check_seconds
from rlcore.interfaces.reward import BATCH_REWARD_TIMEOUT, REWARD_TIMEOUT
from rlcore.tracking.bounds import DEFAULT_TIMEOUT_S as DEFAULT_LOGGER_TIMEOUT_S
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

# Merged into the parent table when dumped: the plugin's options sit next to ``name``.
_FLATTEN = {"flatten": True}

_pos = v.ge(1)
_opt_pos = v.optional(v.ge(1))


def _finite(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        msg = f"must be finite, got {value}"
        raise ValueError(msg)


def _staleness(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < 0:
        msg = f"must be >= 0 (weight versions a trained sample may lag the actor by), got {value}"
        raise ValueError(msg)


# The default of a field the loader resolves from other keys; typed ``Any`` so the field keeps
# its resolved type (``str``, not ``str | None``) for everyone who reads a loaded config.
RESOLVED: Any = None

# Bounds on every wait of a run ([resources] *_timeout_s), in seconds.
DEFAULT_CALL_TIMEOUT_S = 3600.0  # one worker-group call: a whole generate or update may be one
DEFAULT_START_TIMEOUT_S = 600.0  # a group's actors placed and their __init__ done
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0  # a pool's placement groups reserved by Ray
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0  # each torch.distributed collective in the workers
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0  # a worker's heartbeat still for this long: stopped


def _timeout(default: float, text: str) -> Any:
    # Driver-side deadlines (ray.wait is handed at most a poll interval) and thread waits.
    return key(default, text, validator=seconds())


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


# Micro-batching of a role that trains or scores a model (actor, ref, critic, roles).
_MICRO_HELP = (
    "Rows per data-parallel rank in one forward/backward micro-batch. Set this or "
    "max_tokens_per_micro_batch, not both; neither set: a token budget of 16384 "
    "(the actor's) or, for ref/critic/roles, the actor's setting."
)
_MAX_TOKENS_HELP = (
    "Token budget (prompt + response, padded) of one micro-batch per rank: as many rows "
    "as fit (dynamic micro-batches). Set this or micro_batch_size, not both."
)


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

    path: str = attrs.field(
        default="",
        metadata={
            "help": "The reward model's local Hugging Face folder: a ...ForSequenceClassification "
            "with num_labels = 1 and its tokenizer; required with enable (checked before Ray "
            "starts)."
        },
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

    enable: bool = attrs.field(
        default=False,
        metadata={"help": "Score every row with the reward model (role rm, scorer rm)."},
    )
    model: RewardModelModelConfig = attrs.Factory(RewardModelModelConfig)
    engine: PluginSection = attrs.field(default=RESOLVED, metadata={"default": "actor.engine"})
    micro_batch_size: int | None = attrs.field(
        default=None,
        validator=_opt_pos,
        metadata={
            "help": "Rows per data-parallel rank in one reward-model forward; neither this "
            "nor max_tokens_per_micro_batch set: the actor's setting."
        },
    )
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None, validator=_opt_pos, metadata={"help": _MAX_TOKENS_HELP}
    )
    weight: float = attrs.field(
        default=1.0,
        validator=_finite,
        metadata={
            "help": "Weight of the reward model's score (scorer rm) in a row's reward, beside "
            "[reward] weights; 0 logs it without training on it.",
            "allowed": "finite",
        },
    )
    retokenize: Literal["auto", "always", "never"] = attrs.field(
        default="auto",
        validator=v.in_(("auto", "always", "never")),
        metadata={
            "help": "Decode prompt + response and encode them with the reward model's "
            "tokenizer (and chat template, as verl does): auto: when its tokenizer differs "
            "from the policy's; never: score the policy's token ids as they are."
        },
    )
    max_length: int | None = attrs.field(
        default=None,
        validator=_opt_pos,
        metadata={
            "help": "Most tokens of one re-tokenised row; longer rows keep their last "
            "max_length tokens (the response end the score is read at). None: no limit."
        },
    )
    threshold: float = attrs.field(
        default=0.0,
        validator=_finite,
        metadata={
            "help": "The reward model's verdict is score > threshold; reward/rm/disagree_rule "
            "counts the rows where it differs from a rule reward's acc.",
            "allowed": "finite",
        },
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


# The tool-call formats whose tool turn has a fixed text of its own (Qwen2.5's template's),
# usable without the tokenizer's chat template ([agent] tool_turns = "hermes").
BUILTIN_TOOL_TURNS: Final = frozenset({"hermes", "qwen", "qwen3"})


@attrs.frozen(kw_only=True)
class AgentConfig:
    """``[agent]``: multi-turn rollouts with tools (:mod:`rlcore.agent`); absent: single-turn.

    ``tools`` names tool plugins (``register_tools``). The response budget of a conversation,
    all turns together, is ``data.max_response_length``; ``max_turns`` counts model turns
    (verl's ``max_assistant_turns``). ``max_parallel_calls`` (calls run per turn) and
    ``max_tool_response_length`` (characters of a tool's answer kept) are verl's names;
    ``tool_parser`` is verl's ``format``.
    """

    tools: tuple[str, ...] = key((), "Tool plugins the model may call (`rlcore plugins`).")
    tool_parser: str = key(
        "hermes",
        "How tool calls are read from the model's text (verl's format): hermes/qwen "
        "(<tool_call>{json}</tool_call>), qwen3 (the same after <think>...</think>), "
        'llama3_json (the turn is {"name": ..., "parameters": {...}}), glm45 '
        "(<tool_call>NAME<arg_key>..</arg_key><arg_value>..</arg_value></tool_call>).",
        validator=v.in_(("hermes", "qwen", "qwen3", "llama3_json", "glm45")),
    )
    tool_turns: str = key(
        "auto",
        "How the tools and tool turns are written: chat_template (the tokenizer's "
        "template with tools=: the tool schemas in the prompt, each tool turn as the "
        "template renders role 'tool'); hermes (Qwen2.5's fixed text, tool schemas left "
        "to the data's system prompt); auto: hermes for tool_parser hermes/qwen, else "
        "chat_template.",
        validator=v.in_(("auto", "chat_template", "hermes")),
    )
    max_turns: int = key(
        4, "Model turns per conversation (verl's max_assistant_turns).", validator=_pos
    )
    max_tokens_per_turn: int | None = key(
        None,
        "Most tokens one model turn generates; unset: what is left of data.max_response_length.",
        validator=_opt_pos,
    )
    max_parallel_calls: int = key(4, "Tool calls run per model turn.", validator=_pos)
    max_parallel_conversations: int = key(256, "Conversations in flight at once.", validator=_pos)
    tool_timeout_s: float = key(
        5.0,
        "Time limit of one tool call (s).",
        validator=seconds(POLL_MAX_S, "the tool's pipe is polled, a C int of ms"),
    )
    generation_timeout_s: float = key(
        600.0,
        "Time limit of one model turn (s); past it the conversation ends, flagged truncated.",
        validator=seconds(holder="asyncio.wait_for"),
    )
    max_tool_response_length: int = key(
        1000, "Characters of a tool's answer kept in the conversation.", validator=_pos
    )
    # --- agents as black boxes: a harness behind the OpenAI-compatible endpoint (issue 46)
    harness: str | None = key(
        None,
        "A harness plugin (register_harnesses) that runs agent code against an "
        "OpenAI-compatible endpoint on each rollout replica instead of the built-in loop; "
        "samples are assembled from the endpoint's recorded tokens (rlcore.agent.harness).",
    )
    environment: str | None = key(
        None,
        "An environment plugin (register_environments, reset/step) given to each sample: "
        "harnesses get it on their task, the built-in loop steps it with each model turn.",
    )
    harness_isolation: str = key(
        "process",
        "process: each harness run in a child process (killed at harness_timeout_s, "
        "address space capped at harness_memory_mb); thread: in the worker, abandoned at "
        "the timeout (its session closed).",
        validator=v.in_(("process", "thread")),
    )
    harness_timeout_s: float = key(
        300.0,
        "Time limit of one harness run (one sample, all its calls) (s).",
        validator=seconds(holder="the harness's wait"),
    )
    harness_memory_mb: int = key(
        4096, "Address-space limit of a harness child process (MiB).", validator=_pos
    )
    max_calls_per_sample: int = key(
        32, "Endpoint calls one sample may make; later ones are refused (429).", validator=_pos
    )
    request_timeout_s: float = key(
        120.0,
        "Time limit of one endpoint call's generation (s); past it the call is answered 504.",
        validator=seconds(holder="asyncio.wait_for"),
    )
    max_request_bytes: int = key(
        1 << 20,
        "Largest endpoint request body (bytes); larger ones are refused (413).",
        validator=_pos,
    )
    options: dict[str, Any] = attrs.field(
        factory=dict,
        metadata={
            "help": "[agent.options.NAME]: each selected tool's, harness's or environment's "
            "own options (listed per plugin below); it is built with them."
        },
    )

    def turns(self) -> str:
        """``tool_turns`` with ``auto`` resolved: ``"chat_template"`` or ``"hermes"``."""
        if self.tool_turns != "auto":
            return self.tool_turns
        return "hermes" if self.tool_parser in ("hermes", "qwen") else "chat_template"


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """``[trainer]``: length, validation, checkpoints, logging."""

    total_steps: int | None = key(
        None, "Training steps of the run; set this or total_epochs, not both.", validator=_opt_pos
    )
    total_epochs: int | None = key(
        None,
        "Passes over the training prompts; 1 when neither it nor total_steps is set.",
        validator=_opt_pos,
    )
    test_freq: int = key(
        0,
        "Validate every N steps and after the last one; 0: no periodic validation.",
        validator=v.ge(0),
    )
    val_before_train: bool = key(True, "Validate once before the first step (not on resume).")
    save_freq: int = key(
        0,
        "Save a checkpoint every N steps (and after the last); 0: only at the end.",
        validator=v.ge(0),
    )
    resume: str = key(
        "auto",
        '"auto": resume from the run directory\'s latest checkpoint if any; '
        '"off": start over; or a checkpoint path.',
        validator=_nonempty,
    )
    keep_last: int | None = key(
        None, "Checkpoints kept (older ones deleted); unset: keep all.", validator=_opt_pos
    )
    export_final: bool = key(
        True, "Export the final actor as a Hugging Face folder: <run_dir>/final_hf."
    )
    check_finite_on_resume: bool = key(
        True,
        "Before a resume, read the checkpoint's model weights and refuse one holding NaN or "
        "inf, naming the tensor (false: load it as it is).",
    )
    max_consecutive_nonfinite: int = key(
        3,
        "Consecutive steps with a non-finite loss or gradient (each skipped) before the run stops.",
        validator=_pos,
    )
    grad_norm_ceiling: float | None = key(
        None,
        "Divergence guard: a step whose actor or critic gradient norm (before "
        "clipping) exceeds this stops the run unsaved; unset: no ceiling.",
        validator=v.optional(v.gt(0.0)),
    )
    auto_padding: bool = key(
        False,
        "DataProto auto-padding in the driver and every worker: chunk() may split "
        "a batch unevenly (verl's VERL_AUTO_PADDING).",
    )
    experiment_name: str = key(
        "rlcore", "Name of the run (run directory, loggers).", validator=_nonempty
    )
    run_dir: str = key(
        RESOLVED,
        "Directory of checkpoints, metrics and the exported model.",
        shown_default="runs/<experiment_name>",
    )
    seed: int = key(0, "Seed of the workers and rollouts (each rank offsets it), in [0, 2**32).")
    loggers: tuple[str, ...] = key(
        ("console", "jsonl"),
        "Logger plugins: the core's console, jsonl, tensorboard; rlcore-wandb, rlcore-mlflow, ...",
        validator=_loggers,
    )
    logger_options: dict[str, Any] = key(
        factory=dict,
        help="[trainer.logger_options.NAME]: each selected logger's own options "
        "(listed per plugin below).",
    )
    logger_timeout_s: float = key(
        DEFAULT_LOGGER_TIMEOUT_S,
        "Time limit of each call of a logger (one step's metrics, the plots, its start and "
        "close) and of its destination's check before Ray; past it the run goes on without "
        "that logger's metrics (counted, one warning) until the late call returns.",
        # The check's socket polls (a C int of ms); the calls are joined threads.
        validator=seconds(POLL_MAX_S, "a socket's poll, a C int of ms"),
    )
    log_freq: int = key(1, "Print the console table every N steps.", validator=_pos)
    # "one_step_off": the rollout (on a pool of its own) generates batch k+1 while the trainer
    # trains on batch k; samples are then one weight version old. "fully_async" (verl's
    # recipe/fully_async_policy): a trajectory queue, the rollout up to max_staleness batches
    # ahead of the trainer (docs/placement.md).
    async_mode: Literal["off", "one_step_off", "fully_async"] = key(
        "off",
        "one_step_off: the rollout (on a pool of its own, resources.placement) "
        "generates batch k+1 while the trainer trains on batch k (staleness 1); "
        "fully_async: a trajectory queue, the rollout up to trainer.max_staleness batches "
        "ahead.",
        validator=v.in_(("off", "one_step_off", "fully_async")),
    )
    max_staleness: int = key(
        1,
        "fully_async: weight versions a trained sample may lag the actor by (>= 0); "
        "the rollout generates up to this many batches ahead (0: synchronous).",
        validator=_staleness,
    )
    staleness_policy: Literal["drop", "reweight"] = key(
        "drop",
        "fully_async, samples older than max_staleness: drop (regenerate them with "
        "the current weights) or reweight (train them; needs algorithm.rollout_is).",
        validator=v.in_(("drop", "reweight")),
    )
    rollout_data_dir: str | None = key(
        None,
        "Write each trained step's samples (prompt index, uid, data source, weight "
        "version, score) to DIR/<step>.jsonl (verl's trainer.rollout_data_dir).",
    )


# The implicit pool of ``resources.nnodes × processes_per_node`` (verl's name for it).
GLOBAL_POOL = "global_pool"
# Roles that ``resources.placement`` may put on a pool of their own (docs/placement.md): the
# rollout, the reward model, and by name a frozen role an algorithm declares ([roles.NAME],
# e.g. a distillation teacher) or a batched reward declares (a judge). The roles below hold
# the trained weights and stay on global_pool.
PLACEABLE_ROLES = ("rollout", "rm")
COLOCATED_ROLES = ("actor", "ref", "critic", "actor_rollout_ref")
DEFAULT_WEIGHT_SYNC_BUCKET_BYTES = 64 << 20  # 64 MiB per broadcast across pools


@attrs.frozen(kw_only=True)
class PoolConfig:
    """``[resources.pools.<name>]``: a resource pool besides the implicit ``global_pool``.

    ``cpus_per_process`` unset: the top-level ``resources.cpus_per_process``.
    """

    nnodes: int = key(1, "Nodes of the pool.", validator=_pos)
    processes_per_node: int = key(1, "Worker processes per node of the pool.", validator=_pos)
    cpus_per_process: float | None = key(
        None,
        "CPUs per worker of the pool; unset: resources.cpus_per_process.",
        validator=v.optional(v.gt(0.0)),
    )

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

    device: Device = key(
        "cpu",
        "Where workers compute: cpu (gloo) or cuda (one GPU per process).",
        validator=v.in_(("cpu", "cuda")),
    )
    nnodes: int = key(1, "Nodes of the run.", validator=_pos)
    processes_per_node: int = key(
        1, "Worker processes per node (one per GPU on cuda).", validator=_pos
    )
    ray_address: str | None = key(
        None, "Ray cluster to join; unset: RAY_ADDRESS, else a private local Ray."
    )
    cpus_per_process: float = key(
        1.0,
        "CPUs reserved per worker; its torch threads are floor(this), at least 1.",
        validator=v.gt(0.0),
    )
    driver_num_threads: int = key(
        1, "Torch threads of the driver process (rewards and advantages).", validator=_pos
    )
    call_timeout_s: float = _timeout(
        DEFAULT_CALL_TIMEOUT_S, "Time limit of one worker-group call (s)."
    )
    start_timeout_s: float = _timeout(
        DEFAULT_START_TIMEOUT_S, "Time limit for a worker group's actors to start (s)."
    )
    placement_timeout_s: float = _timeout(
        DEFAULT_PLACEMENT_TIMEOUT_S, "Time limit for Ray to reserve a pool's placement groups (s)."
    )
    collective_timeout_s: float = key(
        DEFAULT_COLLECTIVE_TIMEOUT_S,
        "Time limit of each torch.distributed collective (s).",
        # gloo and the c10d store add it to their clocks in ms/ns: measured, 2147484 s holds,
        # 2.1e9 s hangs the rendezvous and 8.6e13 s fails it at once.
        validator=seconds(POLL_MAX_S, "torch.distributed's clocks, a C int of ms"),
    )
    heartbeat_timeout_s: float = _timeout(
        DEFAULT_HEARTBEAT_TIMEOUT_S,
        "A worker whose heartbeat stops for this long is reported stopped (s).",
    )
    pools: dict[str, PoolConfig] = key(
        factory=dict,
        help="[resources.pools.NAME]: resource pools besides the implicit global_pool "
        "(docs/placement.md).",
    )
    placement: dict[str, str] = key(
        factory=dict,
        help="Role -> pool name: rollout, rm, a judge's or an algorithm's frozen role "
        "(e.g. teacher); unmapped roles stay on global_pool, colocated.",
    )
    weight_sync_bucket_bytes: int = key(
        DEFAULT_WEIGHT_SYNC_BUCKET_BYTES,
        "Bytes per broadcast when weights travel to a rollout on its own pool.",
        validator=_pos,
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
