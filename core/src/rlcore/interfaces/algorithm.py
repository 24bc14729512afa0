"""The algorithm contract: :class:`BaseAlgorithm`, whose step program is the driver's loop."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.interfaces.declarations import AlgorithmNeeds, ExtraRole
from rlcore.interfaces.specs import BatchTotals, ModelOutputs

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto


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
        on-policy update take them from its training forward (:mod:`rlcore.roles.levers`).
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
