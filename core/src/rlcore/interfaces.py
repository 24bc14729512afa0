"""The contracts every engine, rollout, reward and algorithm plugin implements.

Each base class is a real :class:`abc.ABC` with few abstract methods, and owns a nested attrs
``Config`` holding the options of its own TOML section. A plugin subclasses both::

    class MyEngine(BaseEngine):
        @attrs.frozen(kw_only=True)          # re-apply: attrs does not inherit kw_only
        class Config(BaseEngine.Config):
            reshard_after_forward: bool = True

        def __init__(self, spec: EngineSpec, config: MyEngine.Config) -> None: ...

The core builds ``Config`` from the plugin's section (``[actor.engine]`` minus ``name``) with
extra keys forbidden, so a typo is reported with its key path before anything starts.

Tensor conventions (verl's names, so verl code ports). ``B`` is the number of rows, ``P`` the
(left-padded) prompt length, ``R`` the response length (``max_new_tokens``, right-padded):

- ``prompts`` (B, P), ``responses`` (B, R), ``input_ids`` = cat(prompts, responses) (B, P+R)
- ``attention_mask`` (B, P+R), ``position_ids`` (B, P+R), ``response_mask`` (B, R) float/int 0-1
- ``old_log_probs``, ``ref_log_prob``, ``values``, ``token_level_scores``,
  ``token_level_rewards``, ``advantages``, ``returns``: all (B, R), aligned with ``responses``
- ``non_tensor_batch["uid"]``: the prompt's id, shared by its ``n`` samples (group key)

Rows are expanded once, on the driver: each prompt is repeated ``rollout.n`` times
(interleaved, same ``uid``) before anything is dispatched, so every plugin sees one row per
sample and a rollout returns exactly one response per input row.

Everything a plugin needs for a call is an argument of that call (temperature, entropy with
gradient, the learning rate); nothing travels in ``DataProto.meta_info`` as a side channel.
The only ``meta_info`` keys the core uses are:

- ``meta_info["metrics"]``: set by a worker method on the DataProto it returns (a dict of
  metric name -> float or list of floats); ``DataProto.concat`` merges the ranks' dicts and
  the driver reduces them. Engines, rollouts and algorithms never read it.
- ``meta_info["epoch"]``: set by the prompt loader on each training batch (the epoch it came
  from); the driver logs it as ``training/epoch``. Plugins never see it.

Capabilities are declared, not probed: an algorithm says what it needs
(:attr:`BaseAlgorithm.needs`, an :class:`AlgorithmNeeds`) and a rollout what it is
(:meth:`BaseRollout.traits`, a :class:`RolloutTraits`, and :meth:`BaseRollout.dispatch_info`);
the core reads only those. The contract is versioned (:data:`CONTRACT_VERSION`, what each
version changed in :data:`CONTRACT_CHANGES`): every plugin module declares the version it was
written for (``contract_version = 2`` at module level) and discovery refuses an older one with
one line naming the change (migration notes: ``core/README.md``, "Contract versions").

This module imports neither torch nor plugins, so discovery stays light.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO, get_args

import attrs

from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from rlcore.dispatch import DispatchInfo
    from rlcore.protocol import DataProto

__all__ = [
    "CONTRACT_CHANGES",
    "CONTRACT_NOTE",
    "CONTRACT_VERSION",
    "DTYPE_NAMES",
    "AlgorithmNeeds",
    "BaseAlgorithm",
    "BaseBatchReward",
    "BaseEngine",
    "BaseLogger",
    "BaseReward",
    "BaseRollout",
    "BaseTool",
    "BatchScores",
    "BatchTotals",
    "EngineSpec",
    "ExtraRole",
    "GenerationResult",
    "GenerationRole",
    "LossFn",
    "ModelOutputs",
    "OptimConfig",
    "RewardBatch",
    "RolloutSpec",
    "RolloutTraits",
    "RunInfo",
    "SamplingParams",
    "ToolError",
    "key",
]

Dtype = Literal["float32", "bfloat16", "float16"]
# The names a ``dtype`` key accepts; torch's dtype of each: rlcore.engine_utils.dtype_from_name.
DTYPE_NAMES: tuple[str, ...] = get_args(Dtype)
Device = Literal["cpu", "cuda"]


# --- the contract's version -----------------------------------------------------------------

#: The plugin contract this rlcore implements. A plugin module declares the version it was
#: written for (``contract_version = 2`` at module level); discovery refuses any other.
CONTRACT_VERSION: Final = 2

#: Where every refusal points: the migration note of each version.
CONTRACT_NOTE: Final = "see core/README.md, Contract versions"

#: What each version changed, for the refusal line of a plugin written for an older one.
CONTRACT_CHANGES: Final[dict[int, str]] = {
    1: "the first contract (the Base* classes of rlcore.interfaces)",
    2: (
        "BaseEngine.forward_backward takes the keyword-only argument temperature; algorithms "
        "declare BaseAlgorithm.needs, rollouts BaseRollout.traits and dispatch_info(), plugin "
        "modules contract_version"
    ),
}


# --- config keys ----------------------------------------------------------------------------

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], Any]


def key(
    default: Any = attrs.NOTHING,
    help: str = "",
    *,
    validator: _Validator | Sequence[_Validator] | None = None,
    factory: Callable[[], Any] | None = None,
    shown_default: str | None = None,
    allowed: str | None = None,
) -> Any:
    """One config key: ``attrs.field`` with its help text as the second argument.

    Every section of a run's TOML is an attrs class (the core's in
    :mod:`rlcore.config.schema`, each plugin's ``Config``) and every key needs help text:
    the reference (``docs/config.md``, ``rlcore config explain``) is read from the fields::

        max_turns: int = key(4, "Model turns per conversation.", validator=v.ge(1))
        path: str = key(help="Local Hugging Face folder.", validator=nonempty)  # required
        sources: dict[str, str] = key(factory=dict, help="data_source -> reward name.")
        tokenizer_path: str = key(RESOLVED, "Folder of the tokenizer.", shown_default="model.path")

    ``default`` (none: the key is required, unless ``factory`` makes it), ``help``
    (required), ``validator`` (one or a list). The metadata is what a hand-written field
    carries: ``"help"``, ``"default"`` from ``shown_default`` (the text shown for a default
    resolved from other keys) and ``"allowed"`` (the text shown for a validator written as a
    function), so both styles mix.
    """
    if not help:
        msg = "key() needs help text: what the key does, for docs/config.md"
        raise TypeError(msg)
    metadata = {"help": help}
    if shown_default is not None:
        metadata["default"] = shown_default
    if allowed is not None:
        metadata["allowed"] = allowed
    return attrs.field(default=default, factory=factory, validator=validator, metadata=metadata)


# --- what the core hands to engines and rollouts ------------------------------------------


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (``[actor.optim]``, ``[critic.optim]``).

    The schedule is computed by the core (:func:`rlcore.engine_utils.learning_rate`, formula
    there) and handed to :meth:`BaseEngine.optimizer_step` as ``lr``; engines build AdamW
    from ``lr`` (the initial value is overwritten each step), ``betas``, ``eps`` and
    ``weight_decay``.
    """

    lr: float = key(
        1e-6,
        "Peak learning rate of AdamW (the schedule scales it each step).",
        validator=attrs.validators.gt(0.0),
    )
    weight_decay: float = key(0.0, "AdamW weight decay.", validator=attrs.validators.ge(0.0))
    betas: tuple[float, float] = key((0.9, 0.999), "AdamW (beta1, beta2).")
    eps: float = key(1e-8, "AdamW epsilon.", validator=attrs.validators.gt(0.0))
    warmup_steps: int = key(
        0, "Optimizer steps of linear warm-up from 0 to lr.", validator=attrs.validators.ge(0)
    )
    schedule: Literal["constant", "cosine"] = key(
        "constant",
        "Learning rate after warm-up: constant, or cosine decay to min_lr_ratio * lr over the run.",
        validator=attrs.validators.in_(("constant", "cosine")),
    )
    # Fraction of ``lr`` the cosine schedule decays to.
    min_lr_ratio: float = key(
        0.0, "Fraction of lr the cosine schedule decays to.", validator=attrs.validators.ge(0.0)
    )


@attrs.frozen(kw_only=True)
class EngineSpec:
    """Everything about the model an engine trains that is not the engine's own option.

    ``role`` is ``"actor"``, ``"critic"``, ``"ref"`` or ``"rm"``. A ``ref`` or ``rm`` engine
    has no optimizer (``optim is None``). A ``critic`` engine adds a scalar value head
    (``value_head``); an ``rm`` engine loads a sequence-classification model with one label
    (``reward_head``) and serves :meth:`BaseEngine.compute_rm_score`.
    Micro-batching is by count (``micro_batch_size`` rows per data-parallel rank) or by a
    token budget (``max_tokens_per_micro_batch``); exactly one is set.
    """

    role: str
    model_path: str
    dtype: Dtype = "float32"
    trust_remote_code: bool = False
    device: Device = "cpu"
    optim: OptimConfig | None = None
    total_steps: int = 1  # optimizer steps the core's LR schedule spans (informational)
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables clipping
    micro_batch_size: int | None = 1
    max_tokens_per_micro_batch: int | None = None
    gradient_checkpointing: bool = False
    value_head: bool = False
    reward_head: bool = False
    seed: int = 0


@attrs.frozen(kw_only=True)
class RolloutSpec:
    """What a rollout needs to know about the model and the lengths it generates.

    ``seed`` is already this rank's own seed (the worker offsets the run seed by its rank), so
    ranks draw different samples and reruns reproduce. Backend options (tensor-parallel size,
    memory fraction, ...) belong in the rollout's own ``Config``, not here.
    """

    model_path: str
    dtype: Dtype = "float32"
    trust_remote_code: bool = False
    device: Device = "cpu"
    max_prompt_length: int = 512
    max_response_length: int = 512
    seed: int = 0


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Sampling for one ``generate`` call: one response per input row (no ``n`` here).

    ``do_sample=False`` (or ``temperature == 0``) is greedy (validation). ``top_k = -1`` is
    off. ``return_log_probs`` asks for ``rollout_log_probs`` of the sampled tokens under
    ``softmax(logits / temperature)`` of the unfiltered logits.
    """

    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    top_p: float = attrs.field(
        default=1.0, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)]
    )
    top_k: int = -1  # -1: off
    max_new_tokens: int = attrs.field(default=512, validator=attrs.validators.ge(1))
    do_sample: bool = True
    return_log_probs: bool = False


@attrs.define(kw_only=True)
class ModelOutputs:
    """A forward pass over a micro-batch, restricted to the response tokens: each (b, R)."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


@attrs.frozen(kw_only=True)
class BatchTotals:
    """Counts over the whole mini-batch, across micro-batches and data-parallel ranks.

    A loss function divides by these (not by the micro-batch's own counts), so that the
    gradient of a mini-batch does not depend on how it was split. The engine sums the
    micro-batch losses' gradients and undoes the data-parallel gradient averaging, so a loss
    returned as ``sum(token losses in micro-batch) / tokens`` yields exactly the token-mean
    gradient of the mini-batch.
    """

    tokens: int  # valid response tokens (sum of response_mask)
    sequences: int  # rows with at least one valid token (padding rows excluded)
    max_response_length: int  # R, for the seq-mean-token-sum-norm normaliser


# loss_fn(outputs, micro_batch, totals) -> (loss to backpropagate, metrics of this micro-batch)
LossFn = Callable[
    ["ModelOutputs", "DataProto", BatchTotals], "tuple[torch.Tensor, dict[str, float]]"
]


@attrs.frozen(kw_only=True)
class GenerationResult:
    """One response of :meth:`BaseRollout.generate_one` (a multi-turn agent's request).

    ``token_ids`` are the generated tokens only, EOS included when generation stopped on it
    (``finish_reason == "stop"``); ``"length"`` means ``max_new_tokens`` was reached.
    ``log_probs`` (same length as ``token_ids``) when ``sampling.return_log_probs``.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    finish_reason: Literal["stop", "length"] = "stop"


# --- what a plugin declares about itself ------------------------------------------------------


@attrs.frozen(kw_only=True)
class AlgorithmNeeds:
    """What an algorithm needs from a run (:attr:`BaseAlgorithm.needs`); the roles follow it.

    - ``reference``: ``ref_log_prob`` in the batch (a KL loss or KL penalty): a reference model.
    - ``critic``: ``values`` in the batch and :meth:`BaseAlgorithm.value_loss`: a critic.
    - ``entropy``: :meth:`BaseAlgorithm.policy_loss` reads ``outputs.entropy`` with gradient.
    - ``rollout_log_probs``: the loss reads the rollout's ``rollout_log_probs``.
    - ``old_log_probs_on_driver``: :meth:`BaseAlgorithm.compute_rewards` or
      :meth:`~BaseAlgorithm.compute_advantages` read ``old_log_probs`` on the driver, so the
      separate old-log-prob pass is kept. True (the default) is the safe answer; False lets an
      on-policy update take them from its own training forward.
    - ``zero_advantage_rows_inert``: a row whose advantages are all zero adds nothing to the
      loss's gradient, so the worker may skip its backward pass. False (the default) is safe.
    - ``extra_roles``: the roles beyond actor/rollout/reference/critic (:class:`ExtraRole`),
      each configured by ``[roles.<name>]``, placed and checkpointed like the built-in ones.
    - ``loss_keys``: batch keys the policy loss reads beyond the default ones (e.g. an extra
      role's ``teacher_log_prob``); the driver sends them with the update's rows.
    """

    reference: bool = False
    critic: bool = False
    entropy: bool = False
    rollout_log_probs: bool = False
    old_log_probs_on_driver: bool = True
    zero_advantage_rows_inert: bool = False
    extra_roles: tuple[ExtraRole, ...] = ()
    loss_keys: tuple[str, ...] = ()


#: What an extra role's worker computes (:attr:`ExtraRole.computes`).
ROLE_COMPUTES: Final = ("log_prob",)


@attrs.frozen(kw_only=True)
class ExtraRole:
    """A role an algorithm needs beyond the built-in ones (:attr:`BaseAlgorithm.extra_roles`).

    ``name``: the role's name, its config section ``[roles.<name>]`` (``model.path`` and
    ``engine`` options of its own) and its folder in a checkpoint. ``computes``: what its
    worker computes; ``"log_prob"``: the log-probs (B, R) of the batch's responses under the
    role's model (a teacher for distillation), returned as :attr:`output_key`.
    ``trainable``: False for a frozen model (no optimizer; the only kind so far).

    The algorithm's step program calls it like a built-in role::

        batch |= ctx.phase("teacher", ctx.roles["teacher"].compute_log_prob, model_in)
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z][a-z0-9_]*"))
    computes: Literal["log_prob"] = attrs.field(
        default="log_prob", validator=attrs.validators.in_(ROLE_COMPUTES)
    )
    trainable: bool = attrs.field(default=False, validator=attrs.validators.in_((False,)))

    @property
    def output_key(self) -> str:
        """The batch key of what the role computes: ``<name>_log_prob``."""
        return f"{self.name}_{self.computes}"


@attrs.frozen(kw_only=True)
class GenerationRole:
    """A frozen model served by a rollout engine in a worker role of its own, declared by a
    batched reward (:attr:`BaseBatchReward.roles`): a generative judge.

    The core places one worker per process of the run's pool (colocated with the policy, as
    an extra role is), builds the ``rollout`` plugin there on ``model_path`` and hands the
    reward the role's worker group through :meth:`BaseBatchReward.bind_roles`. Its weights
    are never synced: the policy's updates do not reach it. The group has one method::

        out = group.generate_text(prompts, sampling).get()   # DataProto in, DataProto out

    (non-blocking: the call returns a future whose ``refs`` the caller may wait on with a
    limit of its own before ``get()``).

    ``prompts.non_tensor_batch["prompt_text"]``: one text per row, which the worker wraps as
    one user turn of the model's chat template (``apply_chat_template``; else the text is
    tokenized as it is), keeps the last ``max_prompt_length`` tokens of (counted in
    ``out.non_tensor_batch["prompt_truncated"]``) and generates from with ``sampling``
    (:class:`SamplingParams`; ``max_new_tokens`` at most ``max_response_length``);
    ``out.non_tensor_batch["generated_text"]`` is the decoded answer (special tokens
    skipped). Rows are split over the group's data-parallel ranks.

    ``name``: the role's name (the worker group's, in logs and errors); ``rollout`` and
    ``rollout_options``: the rollout plugin and its ``Config`` instance (None: defaults);
    ``dtype`` None: the run's ``model.dtype``.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z][a-z0-9_]*"))
    model_path: str
    rollout: str = "hf"
    rollout_options: Any = None
    dtype: Dtype | None = None
    trust_remote_code: bool = False
    max_prompt_length: int = attrs.field(default=1024, validator=attrs.validators.ge(1))
    max_response_length: int = attrs.field(default=256, validator=attrs.validators.ge(1))
    apply_chat_template: bool = True
    # The key of the reward's options that set model_path (errors name
    # reward.options.<reward>.<model_key>; checked before Ray starts).
    model_key: str = "model_path"


@attrs.frozen(kw_only=True)
class RolloutTraits:
    """What the core must know about a rollout before building it (:meth:`BaseRollout.traits`).

    - ``cheap_log_probs``: the rollout returns ``rollout_log_probs`` at no extra pass (vLLM's
      sampler has them), so the driver asks for them by default for the mismatch metrics
      (``[rollout] log_prob_metrics``).
    - ``lora_adapters``: it serves LoRA adapters on the base weights
      (:meth:`BaseRollout.update_adapter`) instead of taking merged weights.
    - ``ranks_per_engine``: policy workers one engine spans (tensor parallelism); 1: each
      worker is an engine of its own. Its ranks then declare their place with
      :meth:`BaseRollout.dispatch_info`.
    """

    cheap_log_probs: bool = False
    lora_adapters: bool = False
    ranks_per_engine: int = attrs.field(default=1, validator=attrs.validators.ge(1))


# --- the four contracts ---------------------------------------------------------------------


class BaseEngine(abc.ABC):
    """A training backend for one model (actor, critic or reference), on CPU (gloo) or GPU.

    Built inside a worker process after ``torch.distributed`` is initialised (the worker sets
    ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` and, on GPU, shows the process
    one device: use ``torch.cuda.current_device()``, not ``LOCAL_RANK``); the engine shards
    over all ranks of the default process group.

    What the core does for every engine, in :mod:`rlcore.engine_utils`: the learning-rate
    schedule (the worker passes ``lr`` to :meth:`optimizer_step`); the micro-batch loop of
    :meth:`forward_backward` around the engine's one-micro-batch forward
    (:func:`~rlcore.engine_utils.accumulate_gradients`: micro-batching by count or token
    budget, the mini-batch :class:`BatchTotals`, token-weighted metric means) and of the
    inference passes (:func:`~rlcore.engine_utils.forward_micro_batches`); the body of
    :meth:`optimizer_step` (:class:`~rlcore.engine_utils.OptimizerGuard`: clipping, the
    non-finite skip, counters); the device (:func:`~rlcore.engine_utils.init_device`) and
    dtype names (:func:`~rlcore.engine_utils.dtype_from_name`). An engine itself builds the
    model, runs one micro-batch forward, owns the optimizer, saves its state and exports.

    Rows whose ``response_mask`` is all zero are padding the driver added so that every rank
    gets the same number of rows: they carry no tokens (the loss ignores them) and are not
    counted in ``BatchTotals.sequences``.
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The engine's own options (``[actor.engine]`` minus ``name``)."""

    def __init__(self, spec: EngineSpec, config: BaseEngine.Config | None = None) -> None:
        self.spec = spec
        # None: the plugin's own defaults, so `MyEngine(spec)` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @classmethod
    def preflight(
        cls, spec: EngineSpec, config: BaseEngine.Config, *, world_size: int, where: str
    ) -> None:
        """Check ``config`` against the model and the placement before any worker starts.

        ``rlcore train`` calls it for every engine role of the run, before Ray starts, with
        the role's spec as the driver builds it, ``world_size`` (processes of the role's pool)
        and ``where`` (the section, e.g. ``[actor.engine]``). Raise
        :class:`~rlcore.errors.ConfigError` in one line naming the key (tensor parallelism
        that does not divide the processes or the heads, LoRA targets that match no module).
        Read the model's ``config.json`` only (build on the meta device at most), never its
        weights. Default: nothing to check.
        """

    @abc.abstractmethod
    def forward_backward(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        temperature: float,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """Accumulate the gradient of ``loss_fn`` over one mini-batch (this rank's share).

        Splits ``batch`` into micro-batches (``spec.micro_batch_size`` rows, or
        ``spec.max_tokens_per_micro_batch``), computes :class:`BatchTotals` over the whole
        mini-batch on all ranks, and for each micro-batch runs the forward pass with logits
        divided by ``temperature`` (the rollout sampled from ``softmax(logits / T)``; 0, greedy,
        scores the unscaled logits), then
        ``loss_fn(outputs, micro_batch, totals)`` and backward. ``with_entropy``: fill
        ``outputs.entropy`` (of the tempered distribution) *with* gradient (an entropy bonus);
        otherwise it may be None or detached. Returns the metrics averaged over micro-batches.
        Does not step the optimizer.
        """

    @abc.abstractmethod
    def optimizer_step(self, *, lr: float) -> float:
        """Clip gradients to ``spec.grad_clip``, step the optimizer at ``lr``, zero grads.

        The optimizer is the engine's choice (AdamW from ``spec.optim`` for the core's
        engines; SGD or another is fine): ``check_engine`` only asks that ``lr`` is applied as
        given (``lr = 0`` changes nothing; ``2 lr`` moves twice as far as ``lr``).

        Returns the grad norm (before clipping). A non-finite norm skips the update (grads are
        zeroed, the optimizer state is untouched) and is returned as is, so the worker can
        report it and keeps the schedule where it was. ``lr`` comes from the core's schedule
        (:func:`rlcore.engine_utils.learning_rate`): an engine must apply exactly this value.
        """

    @abc.abstractmethod
    def compute_log_prob(
        self, batch: DataProto, *, temperature: float, with_entropy: bool = False
    ) -> ModelOutputs:
        """Log-probabilities of ``responses`` under ``softmax(logits / temperature)``, no grad.

        Temperature 0 is greedy sampling: it scores the unscaled logits, exactly as
        temperature 1 (divide by ``temperature`` only when it is neither 0 nor 1); the same
        holds in :meth:`forward_backward`.

        ``with_entropy`` adds the entropy of the same distribution. Returns (B, R) tensors
        for this rank's rows, on CPU.
        """

    @abc.abstractmethod
    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters in HF naming, one tensor at a time, for weight sync.

        Every rank must iterate (gathering is collective); tensors are valid until the next
        item is requested. The rollout buckets them as it needs.
        """

    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Save model and optimizer state (sharded as the engine likes) under ``path``.

        RNG state and the LR schedule's position are saved by the worker, not the engine.
        """

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""

    @abc.abstractmethod
    def export_hf(self, path: str) -> None:
        """Write a Hugging Face folder (config, safetensors, tokenizer) transformers loads.

        Collective: every rank calls it, one writes. Used for ``trainer.export_final`` and
        ``rlcore export``. An engine that cannot export raises :class:`NotImplementedError`
        with a one-line reason; the core then tells the user to set
        ``trainer.export_final = false``.
        """

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Values of the response tokens, (B, R), for a critic (``spec.value_head``)."""
        msg = f"{type(self).__name__} has no value head; it cannot serve the critic role"
        raise NotImplementedError(msg)

    def compute_rm_score(self, batch: DataProto) -> torch.Tensor:
        """A reward model's score of each row, (B,) float32 on CPU, no grad (``spec.reward_head``).

        ``batch`` holds ``input_ids``, ``attention_mask`` and ``position_ids`` (B, T) of whole
        sequences (prompt and response, in the reward model's own tokens, left-padded); the
        score is the sequence-classification head's output at each row's last attended token.
        """
        msg = (
            f"{type(self).__name__} has no reward-model forward; it cannot serve the "
            "reward_model role (choose another [reward_model.engine])"
        )
        raise NotImplementedError(msg)

    def offload(self) -> None:
        """Free accelerator memory while the colocated rollout generates (no-op by default).

        The worker calls it after weight sync, before generation.
        """

    def onload(self) -> None:
        """Undo :meth:`offload`; the worker calls it after generation."""

    def dispatch_info(self) -> DispatchInfo | None:
        """This rank's place in the engine's data-parallel mesh, or None: purely data-parallel.

        An engine whose ranks are not all data-parallel (tensor or pipeline parallelism)
        returns its ``dp_rank``/``dp_size`` and whether this rank is the one whose outputs
        stand for its data-parallel group; the role worker registers it and is called through
        the mesh dispatch (every rank of a group gets the same rows, one rank's output is kept).
        """
        return None

    # --- LoRA (optional: an engine without adapters keeps these defaults) ----------------

    @property
    def ref_in_actor(self) -> bool:
        """Whether this engine computes the frozen reference itself (verl's ``ref_in_actor``).

        True for a LoRA actor: the reference is the same weights with the adapters off, so
        the worker builds no second engine when no separate ``[ref.engine]`` is configured
        and calls :meth:`compute_ref_log_prob` instead.
        """
        return False

    def compute_ref_log_prob(self, batch: DataProto, *, temperature: float) -> ModelOutputs:
        """Log-probs of the base model (adapters off), as :meth:`compute_log_prob` returns."""
        msg = f"{type(self).__name__} has no adapters; build a separate reference engine"
        raise NotImplementedError(msg)

    def adapter_for_sync(self) -> tuple[dict[str, Any], Iterator[tuple[str, torch.Tensor]]] | None:
        """``(peft adapter config dict, adapter tensors)`` for a LoRA-aware rollout, or None.

        Tensors are full, named as in a peft adapter folder (``adapter_model.safetensors``).
        Collective like :meth:`named_parameters_for_sync`. None (the default): no adapters;
        the worker then syncs :meth:`named_parameters_for_sync` (merged weights under LoRA).
        """
        return None

    def export_adapter(self, path: str) -> None:
        """Write the LoRA adapter as a peft folder (``PeftModel.from_pretrained`` loads it).

        Collective like :meth:`export_hf`. Engines without adapters raise
        :class:`NotImplementedError` with a one-line reason.
        """
        msg = f"{type(self).__name__} trains no LoRA adapter (lora_rank = 0); export the model"
        raise NotImplementedError(msg)


class BaseRollout(abc.ABC):
    """A generation backend.

    ``generate`` takes left-padded prompts (``input_ids``, ``attention_mask``,
    ``position_ids``, each (B, P)), one row per wanted sample (the driver already repeated
    each prompt ``n`` times), and returns exactly one response per row, in input order:
    ``prompts`` (B, P), ``responses`` (B, R right-padded to exactly ``max_new_tokens``),
    ``response_mask`` (1 up to and including EOS), ``input_ids``, ``attention_mask``,
    ``position_ids`` (B, P+R) and, when asked, ``rollout_log_probs`` (B, R, 0 on padding).
    Rows with identical prompts may share work inside the rollout (a prefix cache); that is
    the rollout's business.

    Lifecycle, driven by the worker that holds the rollout next to the training engine::

        wake_up(); update_weights(engine.named_parameters_for_sync())   # after each update
        generate(...)                                                    # next step
        sleep()                                                          # before training

    A rollout spanning several processes (tensor parallelism) is built on every rank of its
    group; each rank calls every method with the same arguments (rank-local prompts for
    ``generate``), so collectives line up.
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The rollout's own options (``[rollout]`` minus the shared sampling keys)."""

    #: The rollout serves LoRA adapters on top of the base weights it loaded from
    #: ``spec.model_path`` (e.g. vLLM's LoRA requests): after an update the worker sends only
    #: the adapter (:meth:`update_adapter`). False (the default): the worker streams merged
    #: weights through :meth:`update_weights`, which every rollout accepts. The default
    #: :meth:`traits` reports it as ``lora_adapters``.
    supports_lora_adapters: bool = False

    def __init__(self, spec: RolloutSpec, config: BaseRollout.Config | None = None) -> None:
        self.spec = spec
        # None: the plugin's own defaults, so `MyRollout(spec)` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @classmethod
    def preflight(
        cls, spec: RolloutSpec, config: BaseRollout.Config, *, world_size: int, where: str
    ) -> None:
        """Check ``config`` against the device, the model and the placement before any
        worker starts (``rlcore train``, before Ray; :meth:`BaseEngine.preflight` says more).
        ``world_size``: the processes the rollout runs in. Raise
        :class:`~rlcore.errors.ConfigError` in one line naming the key (e.g. a tensor-parallel
        size the device cannot run). Default: nothing to check.
        """

    @classmethod
    def traits(cls, config: BaseRollout.Config) -> RolloutTraits:
        """What this rollout is with ``config`` (its own ``Config``), before it is built.

        The driver reads it to build the specs. The default is conservative: no cheap
        log-probs, one engine per worker, LoRA adapters as :attr:`supports_lora_adapters`.
        """
        return RolloutTraits(lora_adapters=cls.supports_lora_adapters)

    def dispatch_info(self) -> DispatchInfo | None:
        """This rank's place among the rollout's engines, or None: one engine per worker.

        A rollout whose engine spans several workers (``traits().ranks_per_engine > 1``)
        returns its ``dp_rank``/``dp_size`` (one per engine) and whether this rank's outputs
        stand for its engine; the policy worker registers it as the ``rollout`` mesh, so each
        engine gets its prompts once (the twin of :meth:`BaseEngine.dispatch_info`).
        """
        return None

    @abc.abstractmethod
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """One response per prompt row (see the class docstring for the layout)."""

    async def generate_one(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> GenerationResult:
        """One response for one un-padded prompt: the per-request face for agent loops.

        The default runs :meth:`generate` on a one-row batch in a thread; a server-backed
        rollout (vLLM, SGLang) overrides it with its own async request.
        """
        return await asyncio.to_thread(_generate_one_via_batch, self, prompt_ids, sampling)

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full tensors (HF naming) streamed one at a time from the training engine.

        A tensor is valid only until the next one is requested: copy it (or bucket copies)
        before advancing the iterator.
        """

    def update_adapter(
        self, adapter_config: dict[str, Any], named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Serve this LoRA adapter from now on (only when :attr:`supports_lora_adapters`).

        ``adapter_config``: the dict of a peft ``adapter_config.json`` (``r``, ``lora_alpha``,
        ``target_modules``, ...); ``named_tensors``: full adapter tensors under peft folder
        names (``...q_proj.lora_A.weight``). The base weights are unchanged.
        """
        msg = f"{type(self).__name__} does not serve LoRA adapters; sync merged weights"
        raise NotImplementedError(msg)

    def state_dict(self) -> dict[str, int]:
        """What decides the next samples besides the weights (e.g. a seed counter).

        Saved in checkpoints so that a resumed run samples exactly what an uninterrupted one
        would. Default: nothing.
        """
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def sleep(self) -> None:
        """Free inference memory (KV cache, weights) while training runs; no-op by default.

        Called by the worker after generation, before the training passes.
        """

    def wake_up(self) -> None:
        """Undo :meth:`sleep`; called by the worker before weight sync and generation."""

    def wake_up_weights(self) -> None:
        """Restore only what a weight sync needs (the weights), the KV cache still asleep.

        The colocated worker syncs in verl's order: ``wake_up_weights()`` -> weights in ->
        actor offloaded -> ``wake_up()`` (the KV cache), so the KV cache never shares the
        device with the actor. Default: :meth:`wake_up` (a rollout that cannot split them).
        """
        self.wake_up()


def _generate_one_via_batch(
    rollout: BaseRollout, prompt_ids: list[int], sampling: SamplingParams
) -> GenerationResult:
    import torch

    from rlcore.protocol import DataProto

    ids = torch.tensor([prompt_ids], dtype=torch.long)
    mask = torch.ones_like(ids)
    out = rollout.generate(
        DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": torch.arange(len(prompt_ids)).unsqueeze(0),
            }
        ),
        sampling,
    )
    length = int(out.batch["response_mask"][0].sum())
    tokens = [int(t) for t in out.batch["responses"][0, :length]]
    log_probs = None
    if sampling.return_log_probs and "rollout_log_probs" in out.batch:
        log_probs = [float(x) for x in out.batch["rollout_log_probs"][0, :length]]
    # Without the EOS ids here, a full-length response counts as cut at the limit.
    reason: Literal["stop", "length"] = "length" if length >= sampling.max_new_tokens else "stop"
    return GenerationResult(token_ids=tokens, log_probs=log_probs, finish_reason=reason)


class BaseReward(abc.ABC):
    """A rule reward: pure, fast, deterministic; never ``eval`` model output in-process
    (``rlcore-code`` runs model-written code in a bubblewrap sandbox instead). One sample per
    call, in the reward manager's process pool, each call bounded by ``[reward] timeout_s``;
    a scorer of whole batches (a model, a remote judge) is a :class:`BaseBatchReward`.

    Example::

        reward.score("openai/gsm8k", "... #### 42", "42", {"index": 3})
        # -> 1.0, or {"score": 1.0, "acc": True, "pred": "42"}
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The reward's own options (``[reward.options.NAME]``)."""

    def __init__(self, config: BaseReward.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyReward()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def score(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: str,
        extra_info: dict[str, Any] | None = None,
    ) -> float | dict[str, Any]:
        """Score one decoded response. A dict carries ``score`` plus extras (``acc``, ``pred``)."""


@attrs.frozen(kw_only=True)
class RewardBatch:
    """The rows a :class:`BaseBatchReward` scores in one call (``B`` rows, ``P``, ``R`` as above).

    The reward manager builds it from the step's batch: only the rows whose ``data_source``
    selects the scorer and whose response is not empty (an empty response has no token to put
    a score on; it scores 0), in batch order.

    - ``prompts``, ``responses``: the decoded text (special tokens skipped) of each row's
      prompt and of its valid response tokens, as a per-sample reward's ``solution_str``.
    - ``prompt_ids`` (B, P) left-padded, ``response_ids`` (B, R) right-padded,
      ``attention_mask`` (B, P+R), ``response_mask`` (B, R) float32 0/1 (the valid response
      tokens; a multi-turn row has holes where tool output was inserted): what a reward model
      feeds its forward pass.
    - ``data_sources``, ``ground_truths`` (``reward_model["ground_truth"]``), ``extra_infos``
      (``extra_info``, with an agent run's turn and tool counts merged in, or None): per row,
      as a per-sample reward receives them.
    - ``data``: the same rows as a :class:`~rlcore.protocol.DataProto`, every tensor and
      per-row column of the step (``reward_model``, ``uid``, ...), for a scorer that hands the
      batch to a worker group or reads a column not listed here.
    """

    prompts: tuple[str, ...]
    responses: tuple[str, ...]
    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    data_sources: tuple[str, ...]
    ground_truths: tuple[Any, ...]
    extra_infos: tuple[dict[str, Any] | None, ...]
    data: DataProto

    def __len__(self) -> int:
        return len(self.responses)


@attrs.frozen(kw_only=True)
class BatchScores:
    """What :meth:`BaseBatchReward.score_batch` returns for a :class:`RewardBatch` of B rows.

    - ``scores``: a floating-point tensor, either (B,) — one sequence-level score per row,
      placed on the row's last valid response token like a per-sample reward's — or (B, R) —
      token-level scores aligned with ``response_ids`` (entries outside ``response_mask`` are
      ignored). Every score must be finite.
    - ``extras``: per-row values by name (``{"acc": [True, False, ...]}``), B each; they reach
      the batch's per-row columns as a per-sample reward's dict extras do (``acc`` feeds the
      ``reward/<data_source>/acc`` metric).
    - ``metrics``: floats logged as ``reward/scorer/<name>/<key>`` (``name``: the scorer's
      registered name), e.g. a judge's parse failures or a remote call's latency, beside
      the manager's ``reward/scorer/<name>/mean`` (the mean of ``scores``' rows).
    """

    scores: torch.Tensor
    extras: Mapping[str, Sequence[Any]] = attrs.Factory(dict)
    metrics: Mapping[str, float] = attrs.Factory(dict)


class BaseBatchReward(abc.ABC):
    """A batched scorer: a whole :class:`RewardBatch` in, :class:`BatchScores` out.

    Registered under the same ``register_rewards`` hook and selected by the same ``[reward]``
    keys as a per-sample :class:`BaseReward` (a registered class that subclasses this one is
    batched), and combined with the others by ``[reward] weights``.

    It runs in the driver process, once per step on the rows that select it, not in the
    per-sample rewards' process pool: a batched scorer is usually a model (a reward model, a
    judge) or a remote call, which batches well and holds state a pool would copy. Its wall
    clock is bounded by ``[reward] batch_timeout_s`` (none by default); past it, or when it
    raises or returns the wrong shape, the run stops with one error naming the scorer (a
    per-sample reward's failure scores 0 instead: one row, not the whole batch, is at fault).

    Example::

        class LengthPenalty(BaseBatchReward):
            def score_batch(self, batch):
                n = batch.response_mask.sum(-1)
                return BatchScores(scores=-n / batch.response_mask.shape[1])
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The scorer's own options (``[reward.options.NAME]``)."""

    def __init__(self, config: BaseBatchReward.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyScorer()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def score_batch(self, batch: RewardBatch) -> BatchScores:
        """Score every row of ``batch``: (B,) sequence-level or (B, R) token-level scores."""

    @property
    def roles(self) -> tuple[GenerationRole, ...]:
        """The worker roles this scorer needs (a judge model); none by default.

        The core places each (:class:`GenerationRole`) before the first step and hands
        their worker groups to :meth:`bind_roles`.
        """
        return ()

    def bind_roles(self, groups: Mapping[str, Any]) -> None:
        """Receive the worker group of each declared role, by name, before the first call
        of :meth:`score_batch`; no-op by default."""

    def close(self) -> None:
        """Release what the scorer holds (a client, a model); no-op by default.

        The reward manager calls it once, when the run ends.
        """


class BaseAlgorithm(abc.ABC):
    """An RL algorithm: advantages on the driver, losses inside the engines.

    Losses normalise by the mini-batch :class:`BatchTotals` they are given (never by the
    micro-batch's own counts) and weight tokens by ``response_mask``, so padding rows (mask
    all zero) contribute nothing.

    The same object (rebuilt from its ``Config``) lives in the driver and in every worker, so it
    holds configuration only, never run state (except, e.g., an adaptive KL coefficient, which
    the driver owns and passes in ``batch.meta_info``).
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The algorithm's own options (``[algorithm]`` minus ``name``)."""

    def __init__(self, config: BaseAlgorithm.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyReward()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @property
    def needs(self) -> AlgorithmNeeds:
        """What this algorithm needs from the run; the core reads only this.

        The default gathers the one-flag properties below, so an algorithm may override
        either this or those (an existing ``needs_reference`` override keeps working).
        """
        return AlgorithmNeeds(
            reference=self.needs_reference,
            critic=self.needs_critic,
            entropy=self.needs_entropy,
            rollout_log_probs=self.needs_rollout_log_probs,
            old_log_probs_on_driver=self.needs_old_log_probs_on_driver,
            zero_advantage_rows_inert=self.zero_advantage_rows_inert,
            extra_roles=self.extra_roles,
        )

    @property
    def needs_critic(self) -> bool:
        """Whether a critic (value model) is trained; decides the ``CriticWorker`` role."""
        return False

    @property
    def needs_reference(self) -> bool:
        """Whether ``ref_log_prob`` is needed (a KL loss or KL penalty is configured)."""
        return False

    @property
    def needs_entropy(self) -> bool:
        """Whether :meth:`policy_loss` needs ``outputs.entropy`` with gradient (an entropy bonus).

        Engines skip the entropy's backward graph otherwise (it costs a (b, R, vocab) pass).
        """
        return False

    @property
    def needs_rollout_log_probs(self) -> bool:
        """Whether :meth:`policy_loss` reads the rollout's ``rollout_log_probs``."""
        return False

    @property
    def needs_old_log_probs_on_driver(self) -> bool:
        """Whether the driver side (rewards, advantages) reads ``old_log_probs``.

        True by default (conservative): the separate old-log-prob pass is kept. False lets an
        on-policy update take them from its training forward (:mod:`rlcore.trainer.levers`).
        """
        return True

    @property
    def zero_advantage_rows_inert(self) -> bool:
        """Whether a row whose advantages are all zero adds nothing to the loss's gradient.

        False by default (conservative); True lets the worker leave such rows out of the
        backward pass (``actor.skip_zero_advantage_rows``).
        """
        return False

    @property
    def extra_roles(self) -> tuple[ExtraRole, ...]:
        """The roles this algorithm needs beyond actor/rollout/reference/critic (default: none).

        Each is configured by ``[roles.<name>]`` (its own ``model.path`` and engine options),
        built on its own worker and checkpointed with the run; the step program reaches it as
        ``ctx.roles[name]``.
        """
        return ()

    def step_program(self) -> Any:
        """The step this algorithm runs (a :class:`rlcore.rl.step.StepProgram`); None: the default.

        (Typed ``Any``: the contracts sit below ``rlcore.rl`` and never import it.)

        Return ``StepProgram(after_generate=(...,), before_update=(...,))`` to insert phases
        into the default step, or an instance of a subclass that writes its own
        :meth:`~rlcore.rl.step.StepProgram.run`. Driver side only; called once per run. See
        ``docs/writing-an-algorithm.md``.
        """
        return None

    def state_dict(self) -> dict[str, Any]:
        """Driver-side run state saved in checkpoints (e.g. an adaptive KL coefficient).

        Default: nothing. Only the driver's copy is saved and restored.
        """
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (default: nothing to restore)."""

    def compute_rewards(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        """Turn ``token_level_scores`` into ``token_level_rewards`` (e.g. minus a KL penalty).

        The default copies the scores. Returns the batch and metrics.
        """
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return batch, {}

    @abc.abstractmethod
    def compute_advantages(self, batch: DataProto) -> DataProto:
        """Add ``advantages`` and ``returns`` (B, R), masked by ``response_mask``. Driver side.

        Reads ``token_level_rewards``, ``response_mask``, ``non_tensor_batch["uid"]`` (group
        algorithms) and ``values`` (PPO).
        """

    @abc.abstractmethod
    def policy_loss(
        self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The actor's loss on one micro-batch (see :class:`BatchTotals` for normalisation).

        ``outputs.log_probs`` (and ``entropy``) come with gradient; ``batch`` holds
        ``old_log_probs``, ``advantages``, ``response_mask`` and, with KL, ``ref_log_prob``.
        Metrics: ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
        ``actor/ppo_kl``, and ``actor/kl_loss``/``actor/entropy`` when used.
        """

    def value_loss(
        self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The critic's loss on one micro-batch (``outputs.values`` with gradient)."""
        msg = f"{type(self).__name__} trains no critic"
        raise NotImplementedError(msg)


# --- the tool contract (the fifth plugin kind) ----------------------------------------------
# What an agent loop can call between model turns. A tool plugin registers classes through the
# ``register_tools`` hook like the other kinds, and ``[agent] tools = ["calculator"]`` selects them.


class ToolError(RlcoreError):
    """A tool refused its arguments; the message goes into the conversation as the result."""


class BaseTool(abc.ABC):
    """A function the model may call by name with JSON arguments; returns text.

    ``schema()`` is the OpenAI/Hermes function description: with ``[agent] tool_turns =
    "chat_template"`` it is rendered into every prompt by the tokenizer's chat template
    (``apply_chat_template(tools=...)``, :mod:`rlcore.agent.template`); with ``"hermes"`` the
    data's own system prompt describes the tool. The agent loop finds the tool by
    ``schema()["name"]``; its ``Config`` is set in ``[agent.options.NAME]``. ``call`` is synchronous
    and is run by the loop in a process of its own per call, killed at ``[agent]
    tool_timeout_s`` (:mod:`rlcore.agent.tool_processes`), so the tool must pickle; it must
    not ``eval``/``exec`` model output in-process (``rlcore-code``'s ``code_interpreter`` runs
    it in a sandboxed subprocess). Bad arguments raise :class:`ToolError` (its message is
    shown to the model); anything else raised (``SystemExit`` included) is also caught, shown
    and counted as an error. Example::

        tool.call({"expression": "12 * (3 + 4)"})   # -> "84"
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The tool's own options."""

    def __init__(self, config: BaseTool.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyTool()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def schema(self) -> dict[str, Any]:
        """``{"name": ..., "description": ..., "parameters": <JSON schema object>}``."""

    @abc.abstractmethod
    def call(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool on the parsed arguments; the text returned is shown to the model."""

    @property
    def name(self) -> str:
        return str(self.schema()["name"])


# --- experiment trackers ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RunInfo:
    """What a logger knows of the run it records (driver-side only; never sent to workers).

    ``config`` is the resolved run config as plain TOML-able data (the hyper-parameters);
    ``start_step`` the last completed step when resuming (0 for a new run), so a logger can
    re-open the run it started before (``resuming``) instead of opening a second one.
    """

    run_dir: Path
    experiment_name: str
    total_steps: int | None = None
    start_step: int = 0
    log_freq: int = 1  # the console table every N steps ([trainer] log_freq)
    config: Mapping[str, Any] = attrs.field(factory=dict)
    stream: TextIO | None = None  # the console's stream; None: standard error

    @property
    def resuming(self) -> bool:
        return self.start_step > 0


class BaseLogger(abc.ABC):
    """An experiment tracker: where each step's metrics go (console, files, a service).

    Selected by ``[trainer] loggers = ["console", "jsonl", "wandb"]``; its options come from
    ``[trainer.logger_options.NAME]``. The driver builds every selected logger once, calls
    :meth:`log` after each step with one flat dict (``"critic/score/mean"`` -> float; ``None``
    for a value that was not finite), :meth:`log_files` with the run's plots at the end, and
    :meth:`close` always (also after an error). A logger must not raise from :meth:`log` for a
    service that is down: warn and keep the run going (the run's own ``metrics.jsonl`` is the
    record). Example::

        class PrintLogger(BaseLogger):
            def log(self, metrics, step):
                print(step, metrics.get("critic/score/mean"))
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The logger's own options (``[trainer.logger_options.NAME]``)."""

    def __init__(self, run: RunInfo, config: BaseLogger.Config | None = None) -> None:
        # None: the plugin's own defaults, so `MyLogger(run)` works in tests and notebooks.
        self.run = run
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def log(self, metrics: Mapping[str, float | int | str | None], step: int) -> None:
        """Record ``metrics`` for ``step`` (the number of completed training steps)."""

    @staticmethod
    def numbers(metrics: Mapping[str, Any]) -> dict[str, float | int]:
        """The numeric values of ``metrics`` (what a tracker can plot): no ``None`` (a value
        that was not finite), no strings, no booleans."""
        return {
            key: value
            for key, value in metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }

    def log_files(self, paths: Sequence[Path]) -> None:
        """Attach files the run made (its plots, at the end); most loggers ignore them."""

    def close(self) -> None:
        """Flush and end the run's record; called once, also when the run failed."""
