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

This module imports neither torch nor plugins, so discovery stays light.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

__all__ = [
    "BaseAlgorithm",
    "BaseEngine",
    "BaseReward",
    "BaseRollout",
    "BatchTotals",
    "EngineSpec",
    "LossFn",
    "ModelOutputs",
    "OptimConfig",
    "RolloutSpec",
    "SamplingParams",
]

Dtype = Literal["float32", "bfloat16", "float16"]
Device = Literal["cpu", "cuda"]


# --- what the core hands to engines and rollouts ------------------------------------------


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (``[actor.optim]``, ``[critic.optim]``)."""

    lr: float = attrs.field(default=1e-6, validator=attrs.validators.gt(0.0))
    weight_decay: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = attrs.field(default=1e-8, validator=attrs.validators.gt(0.0))
    warmup_steps: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    schedule: Literal["constant", "cosine"] = attrs.field(
        default="constant", validator=attrs.validators.in_(("constant", "cosine"))
    )
    # Fraction of ``lr`` the cosine schedule decays to.
    min_lr_ratio: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))


@attrs.frozen(kw_only=True)
class EngineSpec:
    """Everything about the model an engine trains that is not the engine's own option.

    ``role`` is ``"actor"``, ``"critic"`` or ``"ref"``. A ``ref`` engine has no optimizer
    (``optim is None``). A ``critic`` engine adds a scalar value head (``value_head``).
    Micro-batching is by count (``micro_batch_size`` rows per data-parallel rank) or by a
    token budget (``max_tokens_per_micro_batch``); exactly one is set.
    """

    role: str
    model_path: str
    dtype: Dtype = "float32"
    trust_remote_code: bool = False
    device: Device = "cpu"
    optim: OptimConfig | None = None
    total_steps: int = 1  # optimizer steps the LR schedule spans
    grad_clip: float = 1.0
    micro_batch_size: int | None = 1
    max_tokens_per_micro_batch: int | None = None
    gradient_checkpointing: bool = False
    value_head: bool = False
    seed: int = 0


@attrs.frozen(kw_only=True)
class RolloutSpec:
    """What a rollout needs to know about the model and the lengths it generates."""

    model_path: str
    dtype: Dtype = "float32"
    trust_remote_code: bool = False
    device: Device = "cpu"
    max_prompt_length: int = 512
    max_response_length: int = 512
    seed: int = 0


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Sampling for one ``generate`` call. ``do_sample=False`` is greedy (validation)."""

    n: int = attrs.field(default=1, validator=attrs.validators.ge(1))
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
    sequences: int  # rows
    max_response_length: int  # R, for the seq-mean-token-sum-norm normaliser


# loss_fn(outputs, micro_batch, totals) -> (loss to backpropagate, metrics of this micro-batch)
LossFn = Callable[
    ["ModelOutputs", "DataProto", BatchTotals], "tuple[torch.Tensor, dict[str, float]]"
]


# --- the four contracts ---------------------------------------------------------------------


class BaseEngine(abc.ABC):
    """A training backend for one model (actor, critic or reference), on CPU (gloo) or GPU.

    Built inside a worker process after ``torch.distributed`` is initialised (the worker sets
    ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``); the engine shards over all ranks
    of the default process group.
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The engine's own options (``[actor.engine]`` minus ``name``)."""

    def __init__(self, spec: EngineSpec, config: BaseEngine.Config | None = None) -> None:
        self.spec = spec
        # None: the plugin's own defaults, so `MyReward()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def forward_backward(self, batch: DataProto, loss_fn: LossFn) -> dict[str, float]:
        """Accumulate the gradient of ``loss_fn`` over one mini-batch (this rank's share).

        Splits ``batch`` into micro-batches (by count or token budget), computes
        :class:`BatchTotals` over the whole mini-batch on all ranks, and for each micro-batch
        runs the forward pass, ``loss_fn(outputs, micro_batch, totals)`` and backward.
        Returns the metrics averaged over micro-batches. Does not step the optimizer.
        """

    @abc.abstractmethod
    def optimizer_step(self) -> float:
        """Clip gradients, step optimizer and LR schedule, zero grads; return the grad norm.

        A non-finite grad norm skips the update (gradients are zeroed) and is returned as is,
        so the caller can report it.
        """

    @abc.abstractmethod
    def compute_log_prob(self, batch: DataProto, *, with_entropy: bool = False) -> ModelOutputs:
        """Log-probabilities (and entropy) of ``responses`` under the model, no gradient.

        Returns (B, R) tensors for this rank's rows, on CPU.
        """

    @abc.abstractmethod
    def named_parameters_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) parameters in HF naming, one tensor at a time, for weight sync.

        Every rank must iterate (gathering is collective); tensors are valid until the next
        item is requested.
        """

    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Save model, optimizer and LR-schedule state (sharded) under directory ``path``."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""

    def compute_values(self, batch: DataProto) -> torch.Tensor:
        """Values of the response tokens, (B, R), for a critic (``spec.value_head``)."""
        msg = f"{type(self).__name__} has no value head; it cannot serve the critic role"
        raise NotImplementedError(msg)

    def export_hf(self, path: str) -> None:
        """Write a Hugging Face folder (config, safetensors, tokenizer) transformers loads."""
        msg = f"{type(self).__name__} does not support export to a Hugging Face folder"
        raise NotImplementedError(msg)

    def train_mode(self) -> None:
        """Prepare for :meth:`forward_backward` (dropout on, etc.)."""

    def eval_mode(self) -> None:
        """Prepare for inference passes."""

    def offload(self) -> None:
        """Move parameters and optimizer state off the accelerator (no-op by default)."""

    def onload(self) -> None:
        """Undo :meth:`offload`."""


class BaseRollout(abc.ABC):
    """A generation backend.

    ``generate`` takes left-padded prompts (``input_ids``, ``attention_mask``,
    ``position_ids``, each (B, P)) and returns ``B * n`` rows, the ``n`` samples of prompt ``i``
    at rows ``i*n .. i*n+n-1``, with ``prompts``, ``responses`` (right-padded to exactly
    ``max_new_tokens``), ``response_mask`` (1 up to and including EOS), ``input_ids``,
    ``attention_mask``, ``position_ids`` and, when asked, ``rollout_log_probs``.
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The rollout's own options (``[rollout]`` minus the shared sampling keys)."""

    def __init__(self, spec: RolloutSpec, config: BaseRollout.Config | None = None) -> None:
        self.spec = spec
        # None: the plugin's own defaults, so `MyReward()` works in tests and notebooks.
        self.config = config if config is not None else type(self).Config()

    @abc.abstractmethod
    def generate(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        """Sample ``sampling.n`` responses per prompt (see the class docstring for layout)."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full tensors (HF naming) streamed from the training engine."""

    def state_dict(self) -> dict[str, int]:
        """What decides the next samples besides the weights (e.g. a seed counter).

        Saved in checkpoints so that a resumed run samples exactly what an uninterrupted one
        would. Default: nothing.
        """
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def sleep(self) -> None:
        """Free inference memory (KV cache, weights) while training runs; no-op by default."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep`."""


class BaseReward(abc.ABC):
    """A rule reward: pure, fast, deterministic; never ``eval`` model output.

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


class BaseAlgorithm(abc.ABC):
    """An RL algorithm: advantages on the driver, losses inside the engines.

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
