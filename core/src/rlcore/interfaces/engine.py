"""The training-engine contract: :class:`BaseEngine`."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from rlcore.interfaces.specs import EngineSpec, LossFn, ModelOutputs, TokenDistributions

if TYPE_CHECKING:
    import torch

    from rlcore.dispatch import DispatchInfo
    from rlcore.protocol import DataProto


class BaseEngine(abc.ABC):
    """A training backend for one model (actor, critic or reference), on CPU (gloo) or GPU.

    Built inside a worker process after ``torch.distributed`` is initialised (the worker sets
    ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE`` and, on GPU, shows the process
    one device: use ``torch.cuda.current_device()``, not ``LOCAL_RANK``); the engine shards
    over all ranks of the default process group.

    What the core does for every engine, in :mod:`rlcore.engine`: the learning-rate
    schedule (the worker passes ``lr`` to :meth:`optimizer_step`); the micro-batch loop of
    :meth:`forward_backward` around the engine's one-micro-batch forward
    (:func:`~rlcore.engine.accumulate_gradients`: micro-batching by count or token
    budget, the mini-batch :class:`BatchTotals`, token-weighted metric means) and of the
    inference passes (:func:`~rlcore.engine.forward_micro_batches`); the body of
    :meth:`optimizer_step` (:class:`~rlcore.engine.OptimizerGuard`: clipping, the
    non-finite skip, counters); the device (:func:`~rlcore.engine.init_device`) and
    dtype names (:func:`~rlcore.engine.dtype_from_name`). An engine itself builds the
    model, runs one micro-batch forward, owns the optimizer, saves its state and exports.

    Rows whose ``response_mask`` is all zero are padding the driver added so that every rank
    gets the same number of rows: they carry no tokens (the loss ignores them) and are not
    counted in ``BatchTotals.sequences``.
    """

    @attrs.frozen(kw_only=True)
    class Config:
        """The engine's own options (``[actor.engine]`` minus ``name``)."""

    # True: the engine compiles its update when ``spec.compile`` is set (``actor.compile``);
    # the driver refuses ``compile = true`` for an engine that leaves this False.
    supports_compile: ClassVar[bool] = False

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
        (:func:`rlcore.engine.learning_rate`): an engine must apply exactly this value.
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

    def shared_parameters_for_sync(self) -> dict[str, torch.Tensor] | None:
        """The engine's live full weights in HF naming, for a rollout in this process to use
        in place of a copy (:meth:`BaseRollout.share_weights`), or None: stream them.

        Only when this rank already holds every parameter whole, as the rollout wants it (no
        sharding across ranks, no LoRA merge, no offload during generation): the tensors must
        be the storage each optimizer step updates in place, so the rollout sees every update
        without a sync. Tied weights come under both names. Not collective, but the answer
        must be the same on every rank (the fallback stream is collective). None by default.
        """
        return None

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

    def next_token_distributions(
        self, batch: DataProto, *, hidden_states: bool = False
    ) -> TokenDistributions:
        """The full next-token distributions of the trained model over ``responses``, no grad.

        Optional: the twin of :meth:`BaseRollout.next_token_distributions` (same batch, same
        :class:`~rlcore.interfaces.TokenDistributions`, temperature 1), for the
        training-inference consistency check. Collective like :meth:`compute_log_prob`; the
        rows of this rank.
        """
        msg = (
            f"{type(self).__name__} cannot return next-token distributions "
            "(BaseEngine.next_token_distributions); the consistency check needs it"
        )
        raise NotImplementedError(msg)

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
