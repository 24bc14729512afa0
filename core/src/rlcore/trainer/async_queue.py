"""The trajectory queue between the rollout's pool and the trainer's (``trainer.async_mode``).

What each mode means is decided here, once (:func:`async_spec`, an :class:`AsyncSpec`):
``one_step_off`` is the queue with one batch ahead; ``fully_async`` (verl's
``recipe/fully_async_policy``) keeps up to ``trainer.max_staleness`` batches generating ahead
of the trainer. The trainer hands each step's context a :class:`GenerationSource`: this queue,
or :class:`SynchronousGeneration` when the mode is off.

Each queued batch is a non-blocking generation on the rollout group
(:meth:`SplitPolicy.generate_async`) of prompts the trainer took from the loader early and
holds back for their step. The rollout actors run one call at a time, so a weight sync queues
behind the generations launched before it and a generation is never torn by a sync: every
token of a sample is drawn with the one weight version its row carries
(``non_tensor_batch[WEIGHT_VERSION_KEY]``). A batch launched *k* steps ahead is therefore
sampled at the actor's version of *k* steps before it trains: staleness *k*,
``max_staleness`` at most. With ``rollout.partial_rollouts`` the sync reaches the rollout
mid-batch and its requests continue with the new weights; a row then carries its oldest
token's version (``rlcore.roles.partial_rollout``), so the rule below bounds every token.

At the step's first generation the queue's head (this step's prompts) is taken, every row's
version is checked against the one staleness rule (:func:`min_fresh_version`, the same rule
that decides how far ahead batches are launched) and
``trainer.staleness_policy`` applies to the rows above it: ``drop`` generates them again with
the current weights (staleness 0), ``reweight`` trains them as they are (the loss's
``algorithm.rollout_is`` weights correct them). Under ``drop`` every trained row is then
asserted to be within the bound. Then the queue is topped up, by the same rule. The first step of a
run generates synchronously (and the first after a resume, when its checkpoint saved no queue).

A checkpoint holds the queue (:mod:`rlcore.trainer.queue_checkpoint`): each queued
generation as the rollout returned it, its weight version and log-probs with it. A save keeps
the loader's state from before the oldest queued batch was taken (``Trainer``'s held batches),
so a resumed run takes those prompts again, in the same order; the step right after the resume
pairs them with the saved generations (:meth:`TrajectoryQueue.load_checkpoint`) and the run goes
on as the unbroken one would, bit for bit. Prompts whose saved generation does not fit (another
config, a checkpoint without the queue) are generated again with the restored weights: nothing
is lost and nothing trained twice either way (docs/placement.md).

Metrics: ``training/staleness`` (max over the batch's rows), ``training/staleness_min``,
``training/staleness_mean``, ``async/queue_depth`` (batches generating or generated ahead,
after the top-up), ``async/stale_dropped`` and ``async/stale_reweighted`` (rows above the
bound), ``async/trainer_idle_s`` (the driver's wait for this step's generation).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import attrs
import numpy as np

from rlcore.errors import RlcoreError
from rlcore.rl.step import StepContext, expand_prompts
from rlcore.roles.rollout_worker import WEIGHT_VERSION_KEY

if TYPE_CHECKING:
    from collections.abc import Callable

    from rlcore.config import TrainerConfig
    from rlcore.dispatch import GroupFuture
    from rlcore.interfaces import SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.trainer.placement import SplitPolicy
    from rlcore.trainer.queue_checkpoint import SavedBatch

log = logging.getLogger(__name__)

__all__ = [
    "AsyncSpec",
    "GenerationSource",
    "StalenessError",
    "SynchronousGeneration",
    "TrajectoryQueue",
    "async_spec",
    "min_fresh_version",
    "stale_rows",
    "staleness_of",
]


@attrs.frozen(kw_only=True)
class AsyncSpec:
    """What the run's ``trainer.async_mode`` means, decided once (:func:`async_spec`).

    ``max_staleness``: weight versions a trained sample may lag the actor by; the queue
    launches a batch only while it will still be within this bound when trained, so it is
    also how many batches generate ahead. ``staleness_policy``: what happens to rows above it.
    """

    mode: Literal["one_step_off", "fully_async"]
    max_staleness: int
    staleness_policy: Literal["drop", "reweight"] = "drop"


def async_spec(trainer: TrainerConfig) -> AsyncSpec | None:
    """The one place an asynchronous mode is given its meaning; None: generate in the step.

    ``one_step_off`` is the queue one batch ahead whose stale rows are regenerated;
    ``fully_async`` reads ``trainer.max_staleness`` and ``trainer.staleness_policy``.
    """
    if trainer.async_mode == "one_step_off":
        return AsyncSpec(mode="one_step_off", max_staleness=1, staleness_policy="drop")
    if trainer.async_mode == "fully_async":
        return AsyncSpec(
            mode="fully_async",
            max_staleness=trainer.max_staleness,
            staleness_policy=trainer.staleness_policy,
        )
    return None


def min_fresh_version(actor_version: int, max_staleness: int) -> int:
    """The oldest weight version a sample may carry to be trained at ``actor_version``: the
    one staleness rule, used where a batch is launched and where its rows are accepted."""
    return actor_version - max_staleness


class StalenessError(RlcoreError):
    """A sample about to be trained lags the actor by more than ``trainer.max_staleness``."""


def staleness_of(gen: DataProto, actor_version: int) -> np.ndarray:
    """Per row: the actor's weight version minus the version the row was sampled with."""
    versions = np.asarray(gen.non_tensor_batch[WEIGHT_VERSION_KEY], dtype=np.int64)
    return actor_version - versions


def stale_rows(staleness: np.ndarray, max_staleness: int) -> np.ndarray:
    """The rows (a boolean mask) whose version is older than :func:`min_fresh_version`."""
    lag = np.asarray(staleness, dtype=np.int64)
    # Versions counted from the actor's (0 here): a row's version is minus its lag.
    return -lag < min_fresh_version(0, max_staleness)


class GenerationSource(Protocol):
    """Where a step's first generation comes from; the trainer hands one to each step's
    context (:class:`rlcore.trainer.context.DriverStepContext`)."""

    def generate(
        self, ctx: StepContext, step_prompts: DataProto | None, rows: DataProto, name: str
    ) -> DataProto:
        """``rows`` (the step's prompts, expanded) joined to their responses.
        ``step_prompts``: the batch of prompts the step was given (None: not known)."""
        ...

    def drain(self) -> None:
        """Wait for what is still generating and forget it."""
        ...


class SynchronousGeneration:
    """Generate in the step, on the policy (``trainer.async_mode = "off"``)."""

    def generate(
        self, ctx: StepContext, step_prompts: DataProto | None, rows: DataProto, name: str
    ) -> DataProto:
        return StepContext.generate(ctx, rows, name)

    def drain(self) -> None:
        """Nothing is ever in flight."""


@attrs.define
class _InFlight:
    prompts: DataProto  # the loader's batch (the trainer holds it back for its step)
    sampling: SamplingParams
    future: GroupFuture | None  # its generation on the rollout group; None: restored
    result: DataProto | None = None  # the generation, once fetched (or read from a checkpoint)

    def get(self) -> DataProto:
        if self.result is None and self.future is not None:
            self.result = self.future.get()
        assert self.result is not None  # one of the two is always set
        return self.result


class TrajectoryQueue:
    """Batches generating ahead of the trainer, as far as :class:`AsyncSpec` allows (module
    docstring); a :class:`GenerationSource`, and what a checkpoint holds of the queue
    (``save_checkpoint`` / ``load_checkpoint``, :class:`rlcore.trainer.state.WorkerState`).

    ``take_ahead()``: the next not-yet-held step's prompts (the trainer holds them back for
    that step), None past the run's last step.
    """

    def __init__(
        self, policy: SplitPolicy, take_ahead: Callable[[], DataProto | None], spec: AsyncSpec
    ) -> None:
        self.policy = policy
        self.take_ahead = take_ahead
        self.spec = spec
        self.pending: deque[_InFlight] = deque()
        # Read from the checkpoint resumed from; the first step pairs them with its prompts.
        self.restored: deque[SavedBatch] = deque()

    def generate(
        self, ctx: StepContext, step_prompts: DataProto | None, rows: DataProto, name: str
    ) -> DataProto:
        """The step's first generation: the queue's head when it holds ``step_prompts``."""
        prompts = ctx.prompts(rows)
        start = time.perf_counter()
        head = self.pending[0] if self.pending else None
        if head is None and self.restored:
            head = self._resume_queue(ctx, step_prompts)
        if head is not None and head.prompts is step_prompts:
            self.pending.popleft()
            gen = ctx.phase(name, head.get)  # the wait that is left of it
        else:
            # Nothing launched for this batch (the first step, after a resume): generate now.
            self.drain()
            gen = ctx.phase(name, self.policy.generate_sequences, prompts, ctx.sampling)
        waited = time.perf_counter() - start
        gen = self._admit(ctx, gen, prompts, name)
        self._top_up(ctx)
        ctx.metrics["async/queue_depth"] = float(len(self.pending))
        ctx.metrics["async/trainer_idle_s"] = waited
        from rlcore.rl.step import join_generated

        return join_generated(rows, gen)  # a harness's split samples repeat their rows

    def _resume_queue(self, ctx: StepContext, step_prompts: DataProto | None) -> _InFlight | None:
        """The first step after a resume: the saved generations become the queue again, the
        first for ``step_prompts``, the others for the prompts taken ahead again (the loader
        gives the same ones, in order). One that does not fit is generated now instead."""
        saved, self.restored = list(self.restored), deque()
        if step_prompts is None:
            return None
        for i, batch in enumerate(saved):
            upcoming = step_prompts if i == 0 else self.take_ahead()
            if upcoming is None:
                break
            why = batch.fits(upcoming, len(upcoming) * ctx.n, ctx.sampling)
            if why is None:
                self.pending.append(_InFlight(upcoming, ctx.sampling, None, batch.gen))
            elif i == 0:
                log.warning("not using the checkpoint's queued generations: %s", why)
                return None
            else:
                log.warning("generating queued batch %d again: %s", i, why)
                self._launch(ctx, upcoming)
        return self.pending[0] if self.pending else None

    def _admit(self, ctx: StepContext, gen: DataProto, prompts: DataProto, name: str) -> DataProto:
        """Apply ``staleness_policy`` to rows above the bound; record the staleness."""
        actor, bound = self.policy.version, self.spec.max_staleness
        drop = self.spec.staleness_policy == "drop"
        staleness = staleness_of(gen, actor)
        stale = stale_rows(staleness, bound)
        dropped = reweighted = 0
        if stale.any() and drop:
            # A batch's rows share one version here, so all of them go; prompts are kept in
            # their order (rows of the same prompts, sampled again with the current weights).
            dropped = len(gen)
            gen = ctx.phase(f"{name}_regen", self.policy.generate_sequences, prompts, ctx.sampling)
            staleness = staleness_of(gen, actor)
            if stale_rows(staleness, bound).any():
                msg = (
                    f"{int(staleness.max())} weight versions between a regenerated sample and "
                    f"the actor (trainer.max_staleness = {bound})"
                )
                raise StalenessError(msg)
        elif stale.any():
            reweighted = int(stale.sum())
        if drop and stale_rows(staleness, bound).any():
            msg = (  # the bound, asserted on every row about to be trained
                f"a sample {int(staleness.max())} weight versions behind the actor would be "
                f"trained (trainer.max_staleness = {bound})"
            )
            raise StalenessError(msg)
        ctx.metrics["training/staleness"] = float(staleness.max())
        ctx.metrics["training/staleness_min"] = float(staleness.min())
        ctx.metrics["training/staleness_mean"] = float(staleness.mean())
        ctx.metrics["async/stale_dropped"] = float(dropped)
        ctx.metrics["async/stale_reweighted"] = float(reweighted)
        return gen

    def _top_up(self, ctx: StepContext) -> None:
        """Launch generations while a batch sampled now is still fresh when trained (one
        update per step: the next batch trains one version on, the one after two, ...)."""
        now = self.policy.version
        while now >= min_fresh_version(now + len(self.pending) + 1, self.spec.max_staleness):
            upcoming = self.take_ahead()
            if upcoming is None:
                return
            self._launch(ctx, upcoming)

    def _launch(self, ctx: StepContext, upcoming: DataProto) -> None:
        prompts = ctx.prompts(expand_prompts(upcoming, ctx.n))
        future = self.policy.generate_async(prompts, ctx.sampling)
        self.pending.append(_InFlight(upcoming, ctx.sampling, future))

    def drain(self) -> None:
        """Wait for the generations still in flight and forget them (the run is ending, or
        their batches are not the ones the loop asks for)."""
        while self.pending:
            self.pending.popleft().get()

    # --- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """The queued generations into checkpoint folder ``path`` (each waited for: after a
        step's weight sync, which queues behind them on the rollout, they are all done)."""
        from rlcore.trainer.queue_checkpoint import save_queue

        batches = [(item.prompts, item.sampling, item.get()) for item in self.pending]
        save_queue(Path(path), self.spec, batches)

    def load_checkpoint(self, path: str) -> None:
        """Read the checkpoint's queued generations; the next step puts them back in the queue."""
        from rlcore.trainer.queue_checkpoint import load_queue

        self.drain()
        self.restored = deque(load_queue(Path(path), self.spec))
