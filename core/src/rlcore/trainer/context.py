"""``DriverStepContext``: the step context of a real run, with the layout blocks filled in.

:class:`rlcore.rl.step.StepContext` is the algorithm's view (plugin API); this is the
trainer's side of it: which tensors a forward pass takes, and how an update's rows are laid
out over the data-parallel ranks of each role's mesh (:mod:`rlcore.trainer.layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlcore.rl.step import StepContext
from rlcore.roles.mesh import ACTOR_MESH, CRITIC_MESH
from rlcore.roles.mismatch import logprob_diff_metrics
from rlcore.roles.policy import POLICY_INPUT_KEYS
from rlcore.trainer.layout import group_index, mini_batch_layout

if TYPE_CHECKING:
    from rlcore.dispatch import DispatchInfo
    from rlcore.interfaces import BaseAlgorithm
    from rlcore.protocol import DataProto
    from rlcore.reward import RewardManager
    from rlcore.roles.specs import UpdateSpec
    from rlcore.trainer.async_queue import GenerationSource
    from rlcore.trainer.specs import RunSpecs
    from rlcore.workers import RayWorkerGroup

__all__ = ["DriverStepContext", "laid_out", "select"]


def select(batch: DataProto, keys: Sequence[str]) -> DataProto:
    """Only the tensors a worker call needs: per-row strings and dicts stay on the driver."""
    return batch.select(batch_keys=list(keys), non_tensor_batch_keys=[])


def laid_out(
    batch: DataProto,
    keys: Sequence[str],
    update: UpdateSpec,
    mesh: Sequence[DispatchInfo],
    *,
    skips_zero_advantage_rows: bool = False,
    keep_groups: bool = False,
) -> DataProto:
    """An update's rows: whole mini-batches per data-parallel rank of the role's ``mesh`` (its
    engine's ``dispatch_info``; tensor-parallel ranks share rows), zero-weight padding.
    ``update.mini_batches`` optimizer steps whatever the number of rows.
    ``skips_zero_advantage_rows``: the update drops those rows, so ranks are balanced on the
    rest; ``keep_groups``: the rows of one ``uid`` stay in one micro-batch
    (:func:`~rlcore.trainer.layout.mini_batch_layout`)."""
    return mini_batch_layout(
        select(batch, keys),
        rows_per_mini_batch=update.rows_per_mini_batch,
        mini_batches=update.mini_batches,
        groups=group_index(batch) if keep_groups else None,
        world_size=mesh[0].dp_size,
        balance_tokens=update.balance_tokens,
        skips_zero_advantage_rows=skips_zero_advantage_rows,
    )


class DriverStepContext(StepContext):
    """A step's context in a run: ``specs`` decide ``n``, sampling and the layouts."""

    def __init__(
        self,
        specs: RunSpecs,
        *,
        policy: RayWorkerGroup,
        critic: RayWorkerGroup | None,
        algorithm: BaseAlgorithm,
        reward_manager: RewardManager,
        step: int,
        next_prompts: Callable[[], DataProto],
        roles: Mapping[str, Any] | None = None,
        world_size: int = 1,
        source: GenerationSource | None = None,
        step_prompts: DataProto | None = None,
        reward_model: RayWorkerGroup | None = None,
    ) -> None:
        super().__init__(
            policy=policy,
            critic=critic,
            algorithm=algorithm,
            reward_manager=reward_manager,
            step=step,
            next_prompts=next_prompts,
            n=specs.n,
            sampling=specs.train_sampling,
            old_log_prob_pass=not specs.policy.reuse_old_log_probs,
            reference=specs.policy.ref is not None,
            roles=roles,
            world_size=world_size,
            reward_model=reward_model,
        )
        self.specs = specs
        self.source = source
        self.step_prompts = step_prompts  # the batch of prompts this step was given
        self._generated = False
        # Called as each phase starts (the fault injector's hook, rlcore.trainer.faults).
        self.on_phase: Callable[[str], None] | None = None

    def phase(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.on_phase is not None:
            self.on_phase(name)
        return super().phase(name, fn, *args, **kwargs)

    def generate(self, batch: DataProto, name: str = "gen") -> DataProto:
        """As :meth:`StepContext.generate`; the step's first generation comes from the
        trainer's generation source (:mod:`rlcore.trainer.async_queue`: synchronous, or the
        queue's head launched during an earlier step); any later one, in the step."""
        if self.source is None or self._generated:
            return super().generate(batch, name)
        self._generated = True
        return self.source.generate(self, self.step_prompts, batch, name)

    def model_input(self, batch: DataProto) -> DataProto:
        self.model_in = select(batch, POLICY_INPUT_KEYS)
        return self.model_in

    def rollout_mismatch(self, batch: DataProto) -> None:
        b = batch.batch
        if "rollout_log_probs" in b and "old_log_probs" in b:  # else the update tallies it
            self.metrics.update(
                logprob_diff_metrics(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"])
            )

    def actor_input(self, batch: DataProto, *, keep_groups: bool = False) -> DataProto:
        keys: tuple[str, ...] = (*POLICY_INPUT_KEYS, "advantages")
        for key in ("old_log_probs", "rollout_log_probs"):  # rollout_is and mismatch
            if key in batch.batch:
                keys = (*keys, key)
        if self.reference:
            keys = (*keys, "ref_log_prob")
        keys = (*keys, *(k for k in self.algorithm.needs.loss_keys if k not in keys))
        mesh = self.policy.dispatch_info(ACTOR_MESH)
        return laid_out(
            batch,
            keys,
            self.specs.policy.update,
            mesh,
            skips_zero_advantage_rows=self.specs.policy.skip_zero_advantage_rows,
            keep_groups=keep_groups,
        )

    def critic_input(self, batch: DataProto) -> DataProto:
        if self.critic is None or self.specs.critic is None:
            msg = "critic_input: this run has no critic"
            raise RuntimeError(msg)
        keys = (*POLICY_INPUT_KEYS, "values", "returns")
        mesh = self.critic.dispatch_info(CRITIC_MESH)
        return laid_out(batch, keys, self.specs.critic.update, mesh)
