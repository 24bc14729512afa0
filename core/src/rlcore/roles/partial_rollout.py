"""``PartialRolloutWorker``: the rollout worker whose weight sync does not wait for the batch.

With ``rollout.partial_rollouts`` (an asynchronous mode, the rollout on its own pool) the
builder places this subclass of :class:`~rlcore.roles.rollout_worker.RolloutWorker` instead.
Its queued generation and its weight receive are ``async def``, so Ray runs it as an async
actor (as :class:`~rlcore.workers.colocate.AsyncColocatedWorker` is) and both run at once,
each in a thread of its own: the receive reaches the rollout while its batch generates, and
the rollout (vLLM's async engine, ``rlcore_vllm.partial``) aborts the requests in flight, loads
the version and continues them with it. Every token then carries the version that sampled it
(``batch["token_weight_versions"]``) and each row's ``weight_version`` is its oldest token's
(:func:`~rlcore.roles.rollout_worker.sample_versions`), so the trajectory queue's one staleness
rule bounds every token of a sample.

Everything else (the blocking ``generate_sequences`` of a step's first or regenerated batch,
checkpoints, the bridge's opening) stays synchronous: it runs on the actor's event loop and
holds it, as a call of a synchronous actor would.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.roles.rollout_worker import RolloutWorker

if TYPE_CHECKING:
    from rlcore.interfaces import SamplingParams
    from rlcore.protocol import DataProto

__all__ = ["PartialRolloutWorker"]


class PartialRolloutWorker(RolloutWorker):
    """A :class:`RolloutWorker` taking weight syncs mid-generation (module docstring)."""

    @register(dispatch_mode=mesh_dispatch_mode("rollout"), blocking=False)
    async def generate_sequences_async(  # type: ignore[override]
        self, prompts: DataProto, sampling: SamplingParams
    ) -> DataProto:
        """The queued generation, in a thread: a sync may arrive while it runs."""
        return await asyncio.to_thread(self._generate, prompts, sampling)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def receive_weights(self, version: int) -> DataProto:  # type: ignore[override]
        """Load ``version`` into the rollout while a queued generation may be running."""
        return await asyncio.to_thread(RolloutWorker.receive_weights, self, version)
