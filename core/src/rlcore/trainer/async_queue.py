"""The trajectory queue between the rollout's pool and the trainer's (``trainer.async_mode``).

``one_step_off`` is the queue with one batch ahead; ``fully_async`` (verl's
``recipe/fully_async_policy``) keeps up to ``trainer.max_staleness`` batches generating ahead
of the trainer. Each queued batch is a non-blocking generation on the rollout group
(:meth:`SplitPolicy.generate_async`) of prompts the trainer took from the loader early and
holds back for their step. The rollout actors run one call at a time, so a weight sync queues
behind the generations launched before it and a generation is never torn by a sync: every
token of a sample is drawn with the one weight version its row carries
(``non_tensor_batch["weight_version"]``). A batch launched *k* steps ahead is therefore sampled
at the actor's version of *k* steps before it trains: staleness *k*, ``max_staleness`` at most.

At the step's first generation the queue's head (this step's prompts) is taken, every row's
staleness (the actor's version minus the row's) is checked against ``max_staleness`` and
``trainer.staleness_policy`` applies to the rows above it: ``drop`` generates them again with
the current weights (staleness 0), ``reweight`` trains them as they are (the loss's
``algorithm.rollout_is`` weights correct them). Under ``drop`` every trained row is then
asserted to be within the bound. Then the queue is topped up to its depth. The first step of a
run, and the first after a resume, generate synchronously.

Checkpoints hold no trajectories: a save keeps the loader's state from before the oldest
queued batch was taken (``Trainer``'s held batches), so a resumed run takes those prompts
again, in the same order, and generates them with the restored weights. Nothing is lost and
nothing trained twice; the regenerated batches have staleness 0 (docs/placement.md says why
regenerating is chosen over saving the queue).

Metrics: ``training/staleness`` (max over the batch's rows), ``training/staleness_min``,
``training/staleness_mean``, ``async/queue_depth`` (batches generating or generated ahead,
after the top-up), ``async/stale_dropped`` and ``async/stale_reweighted`` (rows above the
bound), ``async/trainer_idle_s`` (the driver's wait for this step's generation).
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    from collections.abc import Callable

    from rlcore.dispatch import GroupFuture
    from rlcore.protocol import DataProto
    from rlcore.trainer.placement import SplitPolicy

__all__ = ["StalenessError", "TrajectoryQueue", "stale_rows", "staleness_of"]

WEIGHT_VERSION_KEY = "weight_version"


class StalenessError(RlcoreError):
    """A sample about to be trained lags the actor by more than ``trainer.max_staleness``."""


def staleness_of(gen: DataProto, actor_version: int) -> np.ndarray:
    """Per row: the actor's weight version minus the version the row was sampled with."""
    versions = np.asarray(gen.non_tensor_batch[WEIGHT_VERSION_KEY], dtype=np.int64)
    return actor_version - versions


def stale_rows(staleness: np.ndarray, max_staleness: int) -> np.ndarray:
    """The rows (a boolean mask) whose staleness exceeds ``max_staleness``."""
    return np.asarray(staleness, dtype=np.int64) > max_staleness


@attrs.define
class _InFlight:
    prompts: DataProto  # the loader's batch (the trainer holds it back for its step)
    future: GroupFuture  # its generation on the rollout group


class TrajectoryQueue:
    """Up to ``depth`` batches generating ahead of the trainer (module docstring).

    ``take_ahead()``: the next not-yet-held step's prompts (the trainer holds them back for
    that step), None past the run's last step.
    """

    def __init__(
        self,
        policy: SplitPolicy,
        take_ahead: Callable[[], DataProto | None],
        *,
        depth: int,
        max_staleness: int,
        staleness_policy: str = "drop",
    ) -> None:
        self.policy = policy
        self.take_ahead = take_ahead
        self.depth = depth
        self.max_staleness = max_staleness
        self.staleness_policy = staleness_policy
        self.pending: deque[_InFlight] = deque()
        self.current: DataProto | None = None  # the prompts batch this step trains on

    def generate(self, ctx: Any, rows: DataProto, name: str) -> DataProto:
        """``ctx.generate`` for the step's first generation (see the module docstring)."""
        prompts = ctx.prompts(rows)
        start = time.perf_counter()
        head = self.pending[0] if self.pending else None
        if head is not None and head.prompts is self.current:
            self.pending.popleft()
            gen = ctx.phase(name, head.future.get)  # the wait that is left of it
        else:
            # Nothing launched for this batch (the first step, after a resume): generate now.
            self.drain()
            gen = ctx.phase(name, self.policy.generate_sequences, prompts, ctx.sampling)
        waited = time.perf_counter() - start
        gen = self._admit(ctx, gen, prompts, name)
        self._top_up(ctx)
        ctx.metrics["async/queue_depth"] = float(len(self.pending))
        ctx.metrics["async/trainer_idle_s"] = waited
        return rows.union(gen)

    def _admit(self, ctx: Any, gen: DataProto, prompts: DataProto, name: str) -> DataProto:
        """Apply ``staleness_policy`` to rows above the bound; record the staleness."""
        actor = self.policy.version
        staleness = staleness_of(gen, actor)
        stale = stale_rows(staleness, self.max_staleness)
        dropped = reweighted = 0
        if stale.any() and self.staleness_policy == "drop":
            # A batch's rows share one version here, so all of them go; prompts are kept in
            # their order (rows of the same prompts, sampled again with the current weights).
            dropped = len(gen)
            gen = ctx.phase(f"{name}_regen", self.policy.generate_sequences, prompts, ctx.sampling)
            staleness = staleness_of(gen, actor)
            if stale_rows(staleness, self.max_staleness).any():
                msg = (
                    f"{int(staleness.max())} weight versions between a regenerated sample and "
                    f"the actor (trainer.max_staleness = {self.max_staleness})"
                )
                raise StalenessError(msg)
        elif stale.any():
            reweighted = int(stale.sum())
        if self.staleness_policy == "drop" and int(staleness.max()) > self.max_staleness:
            msg = (  # the bound, asserted on every row about to be trained
                f"a sample {int(staleness.max())} weight versions behind the actor would be "
                f"trained (trainer.max_staleness = {self.max_staleness})"
            )
            raise StalenessError(msg)
        ctx.metrics["training/staleness"] = float(staleness.max())
        ctx.metrics["training/staleness_min"] = float(staleness.min())
        ctx.metrics["training/staleness_mean"] = float(staleness.mean())
        ctx.metrics["async/stale_dropped"] = float(dropped)
        ctx.metrics["async/stale_reweighted"] = float(reweighted)
        return gen

    def _top_up(self, ctx: Any) -> None:
        """Launch generations until ``depth`` batches are ahead (or the run's end)."""
        from rlcore.rl.step import StepContext

        while len(self.pending) < self.depth:
            upcoming = self.take_ahead()
            if upcoming is None:
                return
            prompts = StepContext.prompts(upcoming.repeat(ctx.n, interleave=True))
            future = self.policy.generate_async(prompts, ctx.sampling)
            self.pending.append(_InFlight(upcoming, future))

    def drain(self) -> None:
        """Wait for the generations still in flight and forget them (the run is ending, or
        their batches are not the ones the loop asks for)."""
        while self.pending:
            self.pending.popleft().future.get()
