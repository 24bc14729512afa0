"""What the core hands to engines and rollouts: specs, sampling, optimizer options, outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, get_args

import attrs

from rlcore.interfaces.config_key import key

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto


Dtype = Literal["float32", "bfloat16", "float16"]
# The names a ``dtype`` key accepts; torch's dtype of each: rlcore.engine.dtype_from_name.
DTYPE_NAMES: tuple[str, ...] = get_args(Dtype)
Device = Literal["cpu", "cuda"]


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (``[actor.optim]``, ``[critic.optim]``).

    The schedule is computed by the core (:func:`rlcore.engine.learning_rate`, formula
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
    ``compile`` (``actor.compile``, ``critic.compile``) asks for a compiled update; only an
    engine whose :attr:`BaseEngine.supports_compile` is true gets it (checked before Ray
    starts). ``max_prompt_length``/``max_response_length`` (the data's, None: unknown) bound
    the shapes such an engine pads micro-batches to.
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
    compile: bool = False
    max_prompt_length: int | None = None
    max_response_length: int | None = None


@attrs.frozen(kw_only=True)
class RolloutSpec:
    """What a rollout needs to know about the model and the lengths it generates.

    ``seed`` is already this rank's own seed (the worker offsets the run seed by its rank), so
    ranks draw different samples and reruns reproduce. Backend options (tensor-parallel size,
    memory fraction, ...) belong in the rollout's own ``Config``, not here.
    ``partial_rollouts`` (``rollout.partial_rollouts``): a weight sync may arrive while
    ``generate`` runs, from another thread; the rollout then continues its requests with the
    new weights and returns ``token_weight_versions`` (only rollouts whose
    :meth:`BaseRollout.traits` declare ``partial_rollouts`` get it).
    """

    model_path: str
    dtype: Dtype = "float32"
    trust_remote_code: bool = False
    device: Device = "cpu"
    max_prompt_length: int = 512
    max_response_length: int = 512
    seed: int = 0
    partial_rollouts: bool = False


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

    @property
    def greedy(self) -> bool:
        """The argmax token at every step: ``do_sample`` off or ``temperature`` 0."""
        return not self.do_sample or self.temperature == 0.0


@attrs.define(kw_only=True)
class ModelOutputs:
    """A forward pass over a micro-batch, restricted to the response tokens: each (b, R)."""

    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


@attrs.define(kw_only=True)
class TokenDistributions:
    """The full next-token distributions over the response positions (the consistency check).

    ``logits``: (B, R, V) float32 on CPU; row ``i``, column ``j`` predicts response token
    ``j`` (position ``P-1+j``), at temperature 1. Log-probabilities are fine too: the check
    compares ``log_softmax`` of each row, so any shift per position cancels.
    ``hidden_states``: when asked, one (B, R, H) float32 tensor per decoder layer, the
    residual stream after that layer at the same positions (before the final norm), or None
    where the backend cannot return them.
    """

    logits: torch.Tensor
    hidden_states: list[torch.Tensor] | None = None


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
