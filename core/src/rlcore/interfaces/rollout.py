"""The generation contract: :class:`BaseRollout`."""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import attrs

from rlcore.interfaces.declarations import RolloutTraits
from rlcore.interfaces.specs import (
    GenerationResult,
    RolloutSpec,
    SamplingParams,
    TokenDistributions,
)

if TYPE_CHECKING:
    import torch

    from rlcore.dispatch import DispatchInfo
    from rlcore.protocol import DataProto


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

    def share_weights(self, named_tensors: dict[str, torch.Tensor]) -> bool:
        """Use these tensors as the weights from now on, without a copy, if the rollout can.

        ``named_tensors``: :meth:`BaseEngine.shared_parameters_for_sync`, the training
        engine's live weights in this process (every name, tied weights under both names);
        the engine updates them in place and the rollout must never write to them. Return
        True when the rollout now reads them (0 bytes moved), False to have the worker stream
        :meth:`update_weights` instead (the default: another process, device or dtype).
        Decide before changing anything, and the same way on every rank.
        """
        return False

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

    def next_token_distributions(
        self, batch: DataProto, *, hidden_states: bool = False
    ) -> TokenDistributions:
        """The full next-token distributions this rollout samples from, over ``responses``.

        Optional (``rlcore check consistency`` and
        :func:`rlcore.testing.conformance.check_consistency` need it): ``batch`` holds
        ``input_ids``, ``attention_mask``, ``position_ids`` (B, P+R) and ``responses`` (B, R),
        as :meth:`generate` returns them; the result is a
        :class:`~rlcore.interfaces.TokenDistributions` at temperature 1, computed by the
        inference engine itself (its kernels and precision), not by a second model.
        """
        msg = (
            f"{type(self).__name__} cannot return next-token distributions "
            "(BaseRollout.next_token_distributions); the consistency check needs it"
        )
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
