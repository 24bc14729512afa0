"""The driver loop: one process writes the algorithm as a plain for-loop over batches.

    while not plan.is_last(step):
        batch   = next_prompts()
        batch   = program.run(ctx, batch)      # rlcore.rl.step: generate, log-probs, reward,
        step   += 1                            # advantages, updates, one line per phase
        validate / log / save as the plan says

The step itself is the algorithm's :class:`~rlcore.rl.step.StepProgram`
(:meth:`BaseAlgorithm.step_program`, None: the default GRPO/PPO/RLOO program). Validation
(greedy by default, ``[rollout.val]``) runs before training and as the
:class:`~rlcore.trainer.plan.LoopPlan` says, and reports ``val/<data_source>/score`` and
``val/<data_source>/acc``.

Everything a checkpoint holds is one :class:`~rlcore.trainer.state.RunState` (counters, the
dataloader, the algorithm's and the program's driver state, the role workers); checkpoints
also keep the driver's RNG and the resolved config (see :mod:`rlcore.checkpoint` for the
layout). A step whose update was non-finite (loss or gradient) is skipped by the engine and
reported (``actor/nonfinite``); ``MAX_CONSECUTIVE_NONFINITE`` of them in a row stop the run
with :class:`NonFiniteError` before anything is saved.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from rlcore.errors import DataError, RlcoreError
from rlcore.rl.step import StepContext, StepProgram, expand_prompts
from rlcore.roles.rollout_worker import WEIGHT_VERSION_KEY
from rlcore.tracking.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    peak_rss_gb,
    timed,
    timing_metrics,
)
from rlcore.tracking.reductions import reduce_metrics
from rlcore.trainer import divergence
from rlcore.trainer.async_queue import SynchronousGeneration, TrajectoryQueue
from rlcore.trainer.context import DriverStepContext
from rlcore.trainer.placement import SplitPolicy
from rlcore.trainer.state import DATALOADER, LoopCounters, RunState

if TYPE_CHECKING:
    from rlcore.checkpoint import CheckpointManager
    from rlcore.data import PromptDataLoader
    from rlcore.interfaces import BaseAlgorithm
    from rlcore.protocol import DataProto
    from rlcore.reward import RewardManager
    from rlcore.tracking import Tracker
    from rlcore.tracking.flops import MfuMeter
    from rlcore.trainer.async_queue import GenerationSource
    from rlcore.trainer.elastic import ScaleWatcher
    from rlcore.trainer.faults import FaultInjector
    from rlcore.trainer.plan import LoopPlan
    from rlcore.trainer.specs import RunSpecs
    from rlcore.workers import RayWorkerGroup

log = logging.getLogger(__name__)

__all__ = [
    "MAX_CONSECUTIVE_NONFINITE",
    "Components",
    "NonFiniteError",
    "Trainer",
]

# Consecutive steps with a non-finite loss or gradient before the run stops; the default of
# ``trainer.max_consecutive_nonfinite``.
MAX_CONSECUTIVE_NONFINITE = 3

# Per-step flags the workers report: > 0 when an optimizer update was skipped.
_NONFINITE_KEYS = ("actor/nonfinite", "critic/nonfinite")

# The worker groups' names in the checkpoint map (each writes its own folder).
POLICY_ROLE = "actor_rollout_ref"
CRITIC_ROLE = "critic"
RM_ROLE = "rm"  # rlcore.roles.reward_model.RM_ROLE (its module imports the worker base)


class NonFiniteError(RlcoreError):
    """Too many consecutive steps had a non-finite loss or gradient."""


class RecoveryHooks(Protocol):
    """What the loop reads and tells of :class:`rlcore.trainer.recovery.Recovery`, which runs
    this loop (naming it here would close a circle)."""

    last_saved: Path | None
    faults: FaultInjector | None

    def metrics(self) -> dict[str, float]: ...


@attrs.define(kw_only=True)
class Components:
    """What the loop works with, built by :func:`rlcore.trainer.run_training`.

    ``roles``: the algorithm's extra roles (:attr:`BaseAlgorithm.extra_roles`) by name;
    ``config_text``: the resolved config as TOML, written into every checkpoint.
    """

    policy: RayWorkerGroup
    critic: RayWorkerGroup | None
    algorithm: BaseAlgorithm
    reward_manager: RewardManager
    train_loader: PromptDataLoader
    val_loader: PromptDataLoader | None
    tracker: Tracker
    checkpoints: CheckpointManager | None = None
    roles: dict[str, RayWorkerGroup] = attrs.Factory(dict)
    reward_model: RayWorkerGroup | None = None  # [reward_model]: the role "rm"
    world_size: int = 1
    config_text: str = ""
    mfu: MfuMeter | None = None  # perf/mfu per step (None: the model's peak is unknown)
    recovery: RecoveryHooks | None = None  # restarts, fault metrics and injection
    scale: ScaleWatcher | None = None  # `rlcore scale` requests (async, rollout on its pool)


class Trainer:
    """Runs :meth:`fit`: the run's specs, its plan (cadence) and its components."""

    def __init__(self, specs: RunSpecs, plan: LoopPlan, components: Components) -> None:
        self.specs = specs
        self.plan = plan
        self.parts = parts = components
        self.program: StepProgram = parts.algorithm.step_program() or StepProgram()
        workers: dict[str, RayWorkerGroup] = {POLICY_ROLE: parts.policy}
        if parts.critic is not None:
            workers[CRITIC_ROLE] = parts.critic
        if parts.reward_model is not None:  # frozen: its checkpoint names its model only
            workers[RM_ROLE] = parts.reward_model
        self.state = RunState(
            counters=LoopCounters(total_steps=plan.total_steps),
            driver={
                DATALOADER: parts.train_loader,
                "algorithm": parts.algorithm,
                "program": self.program,
            },
            workers={**workers, **parts.roles},
        )
        self.last_metrics: dict[str, float] = {}
        self._last_model_in: DataProto | None = None
        self._batches: Iterator[DataProto] | None = None
        # trainer.async_mode: later steps' prompts, taken early to start their generation,
        # each with the loader's state from before it was taken (a save keeps the oldest's).
        self._held: deque[tuple[DataProto, dict[str, Any]]] = deque()
        self.source: GenerationSource = SynchronousGeneration()
        self.queued = specs.asynchronous is not None
        if specs.asynchronous is not None:
            if not isinstance(parts.policy, SplitPolicy):
                mode = specs.asynchronous.mode
                msg = f"trainer.async_mode = {mode!r} needs the rollout on its own pool"
                raise RlcoreError(msg)
            queue = TrajectoryQueue(parts.policy, self._take_ahead, specs.asynchronous)
            self.source = queue
            self.state.driver[DATALOADER] = _PeekAwareLoader(self)
            self.state.files["async_queue"] = queue  # its generations, for an exact resume

    # --- state (what a checkpoint holds) --------------------------------------------------

    def save_checkpoint(self) -> Path | None:
        """Write ``global_step_<step>`` (the :class:`RunState`, config) atomically."""
        if self.parts.checkpoints is None:
            return None
        text = self.parts.config_text
        path = self.parts.checkpoints.save(
            self.state.counters.step, lambda tmp: self.state.save(tmp, config_text=text)
        )
        if self.parts.recovery is not None:  # where a lost worker's recovery goes back to
            self.parts.recovery.last_saved = path
        return path

    def restore(self, path: Path) -> None:
        """Load checkpoint ``path``: step, dataloader, algorithm, program, RNG and workers."""
        self.state.restore(path)

    # --- the loop -------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train up to ``total_steps``; returns the last step's metrics.

        Saves as the plan says (``trainer.save_freq`` and after the last step). A resumed
        run does not validate before training again (its first run did, at those weights).
        """
        plan, counters, tracker = self.plan, self.state.counters, self.parts.tracker
        if plan.validate_before(resumed=counters.resumed_from is not None):
            val = self.validate()
            tracker.log(val, step=counters.step)
            log.info("validation before training: %s", _fmt(val))
        with _deferred_interrupt() as interrupted:
            while not plan.is_last(counters.step):
                if self.parts.scale is not None and isinstance(self.parts.policy, SplitPolicy):
                    self.parts.scale.poll(self.parts.policy)  # between steps: replicas
                batch = self.next_prompts()
                metrics = self.train_step(batch)
                counters.step += 1
                self._check_finite(metrics)
                divergence.check_grad_norm(metrics, counters.step, plan.grad_norm_ceiling)
                if plan.validate_after(counters.step):
                    metrics |= self.validate()
                metrics["training/epoch"] = float(batch.meta_info.get("epoch", 0))
                tracker.log(metrics, step=counters.step)
                self.last_metrics = metrics
                if plan.save_after(counters.step, interrupted=interrupted.is_set()):
                    # Never save diverged weights: score the batch with them first.
                    divergence.check_policy_finite(
                        self.parts.policy, self._last_model_in, counters.step
                    )
                    self.save_checkpoint()
                if interrupted.is_set():
                    log.warning("interrupted: saved step %d, stopping", counters.step)
                    raise KeyboardInterrupt
        self.source.drain()
        if counters.resumed_from is not None and counters.resumed_from >= counters.total_steps:
            log.info("checkpoint step %d is the last step: nothing left to train", counters.step)
        return self.last_metrics

    def _take_ahead(self) -> DataProto | None:
        """The prompts of the first step after those already held, held back for it; None
        past the run's last step (the step being trained is ``counters.step + 1``)."""
        if self.plan.is_last(self.state.counters.step + 1 + len(self._held)):
            return None
        state = self.parts.train_loader.state_dict()
        batch = self._next_from_loader()
        self._held.append((batch, state))
        return batch

    def next_prompts(self) -> DataProto:
        """The next training batch of prompts; an epoch's end starts the next epoch."""
        if self._held:  # taken early by the rollout queue, for this step
            return self._held.popleft()[0]
        return self._next_from_loader()

    def _next_from_loader(self) -> DataProto:
        for _ in range(2):  # the second try is the next epoch's first batch
            if self._batches is None:
                self._batches = iter(self.parts.train_loader)
            try:
                return next(self._batches)
            except StopIteration:
                self._batches = None
        msg = (
            "the training loader yields no batch: check data.train_files and data.train_batch_size"
        )
        raise DataError(msg)

    def _check_finite(self, metrics: dict[str, float]) -> None:
        """Count steps whose update was skipped; stop (before any save) after too many."""
        counters = self.state.counters
        skipped = any(
            not math.isfinite(metrics.get(key, 0.0)) or metrics.get(key, 0.0) > 0
            for key in _NONFINITE_KEYS
        )
        metrics["training/nonfinite_step"] = 1.0 if skipped else 0.0
        if not skipped:
            counters.nonfinite_in_a_row = 0
            return
        counters.nonfinite_in_a_row += 1
        limit = self.plan.max_consecutive_nonfinite
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row, stop at %d)",
            counters.step,
            counters.nonfinite_in_a_row,
            limit,
        )
        if counters.nonfinite_in_a_row >= limit:
            # Log the failing step first so metrics.jsonl shows it, then stop unsaved.
            metrics["training/epoch"] = float(self.parts.train_loader.state_dict()["epoch"])
            self.parts.tracker.log(metrics, step=counters.step)
            msg = (
                f"{counters.nonfinite_in_a_row} consecutive steps had a non-finite loss or "
                f"gradient (last at step {counters.step}); stopping without saving the bad "
                "state. Lower actor.optim.lr (or critic.optim.lr), set actor.grad_clip, or "
                "check the data and rewards; resume from the last checkpoint"
            )
            raise NonFiniteError(msg)

    def context(self, step_prompts: DataProto | None = None) -> DriverStepContext:
        """A fresh context for the step on ``step_prompts`` (the program's blocks, empty
        metrics, the trainer's generation source)."""
        parts = self.parts
        ctx = DriverStepContext(
            self.specs,
            policy=parts.policy,
            critic=parts.critic,
            roles=parts.roles,
            reward_model=parts.reward_model,
            algorithm=parts.algorithm,
            reward_manager=parts.reward_manager,
            step=self.state.counters.step,
            next_prompts=self.next_prompts,
            world_size=parts.world_size,
            source=self.source,
            step_prompts=step_prompts,
        )
        faults = parts.recovery.faults if parts.recovery is not None else None
        if faults is not None:  # rlcore.trainer.faults: a fault fires as its phase starts
            step = self.state.counters.step + 1
            ctx.on_phase = lambda name: faults.at_phase(name, step)
        return ctx

    def train_step(self, batch: DataProto) -> dict[str, float]:
        """One step of the program on a batch of prompts. Returns the step's metrics."""
        ctx = self.context(batch)
        with timed("step", ctx.timing):
            batch = self.program.run(ctx, batch)
        self._last_model_in = ctx.model_in  # the divergence guard rescores it before a save
        if self.specs.rollout_data_dir:
            _dump_samples(Path(self.specs.rollout_data_dir), self.state.counters.step + 1, batch)
        metrics = {
            **ctx.worker_metrics,
            **ctx.metrics,
            **compute_data_metrics(batch),
            **timing_metrics(ctx.timing),
            **compute_throughput_metrics(batch, ctx.timing, n_workers=ctx.world_size),
        }
        metrics["perf/samples_per_s"] = len(batch) / max(ctx.timing["step"], 1e-9)
        metrics["perf/peak_rss_gb/driver"] = peak_rss_gb()
        if self.parts.mfu is not None:
            metrics |= self.parts.mfu.metrics(batch, metrics)
        if self.parts.recovery is not None:
            metrics |= self.parts.recovery.metrics()
        if isinstance(self.parts.policy, SplitPolicy):
            metrics["fault/rollout_replicas"] = float(len(self.parts.policy.replicas))
        if self.queued:
            # Training throughput: the step's samples over the step less its wait for them.
            busy = ctx.timing["step"] - ctx.metrics.get("async/trainer_idle_s", 0.0)
            metrics["async/train_samples_per_s"] = len(batch) / max(busy, 1e-9)
        return metrics

    # --- validation -----------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """Generate on the validation set (``[rollout.val]`` sampling) and score it.

        Returns ``val/<data_source>/score`` and ``val/<data_source>/acc`` (means over all
        samples of that source), ``timing_s/validate`` and, with ``[agent]``, the agent
        metrics of the validation conversations (``val/agent/tool_use_rate``, ...).
        """
        val_loader, policy = self.parts.val_loader, self.parts.policy
        if val_loader is None:
            return {}
        timing: dict[str, float] = {}
        sources: list[str] = []
        scores: list[float] = []
        accs: list[float] = []
        lengths: list[float] = []
        agent: dict[str, list[float]] = {}  # [agent] runs: tool use under validation sampling
        from rlcore.reward.manager import extra_means
        from rlcore.reward.model import pooled_disagreement
        from rlcore.rl.step import join_generated

        extras: list[dict[str, Any]] = []  # the rewards' other extras, per row
        rm_agreement: list[dict[str, float]] = []  # [reward_model]: its verdicts vs a rule's
        with timed("validate", timing):
            for batch in val_loader:
                batch = expand_prompts(batch, self.specs.val_n)
                prompts = StepContext.prompts(batch)
                gen = policy.generate_sequences(prompts, self.specs.val_sampling)
                for key, value in reduce_metrics(gen.meta_info.pop("metrics", None) or {}).items():
                    if key.startswith("agent/"):
                        agent.setdefault(key, []).append(value)
                batch = join_generated(batch, gen)  # a harness's split samples repeat rows
                if self.parts.reward_model is not None:  # its scores, for the scorer "rm"
                    rm = self.parts.reward_model.compute_rm_score(StepContext.rm_input(batch))
                    rm.meta_info.pop("metrics", None)
                    batch |= rm
                out, reward_metrics = self.parts.reward_manager(batch)
                rm_agreement.append(reward_metrics)
                sources += [str(s) for s in batch.non_tensor_batch["data_source"]]
                scores += [float(s) for s in out.non_tensor_batch["score"]]
                accs += [float(bool(a)) for a in out.non_tensor_batch["acc"]]
                extras += _row_extras(out.non_tensor_batch, len(out))
                lengths += batch.batch["response_mask"].sum(-1).float().tolist()
        src = np.asarray(sources, dtype=object)
        score_arr, acc_arr = np.asarray(scores), np.asarray(accs)
        metrics: dict[str, float] = {}
        for ds in sorted(set(sources)):
            sel = src == ds
            metrics[f"val/{ds}/score"] = float(score_arr[sel].mean())
            metrics[f"val/{ds}/acc"] = float(acc_arr[sel].mean())
            metrics.update(extra_means(extras, sel, ds, prefix="val"))
        if lengths:
            metrics["val/response_length/mean"] = float(np.mean(lengths))
        metrics |= pooled_disagreement(rm_agreement, prefix="val/rm/")
        for key, values in agent.items():
            metrics[f"val/{key}"] = float(np.mean(values))
        metrics |= timing_metrics(timing)
        return metrics


class _PeekAwareLoader:
    """The training loader as a checkpoint sees it under ``trainer.async_mode``: while later
    steps' prompts are held back (their generations queued), its state is the one from before
    the oldest of them was taken, so a resumed run takes them again, in order, and pairs them
    with the queue's saved generations (or generates them again with the restored weights):
    no prompt lost, none trained twice."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        held = self.trainer._held
        if held:
            return dict(held[0][1])
        return dict(self.trainer.parts.train_loader.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        trainer = self.trainer
        trainer._held.clear()
        trainer._batches = None
        trainer.parts.train_loader.load_state_dict(state)


def _dump_samples(folder: Path, step: int, batch: DataProto) -> None:
    """``trainer.rollout_data_dir``: one JSON line per trained sample of ``step``, written
    whole (a step trained again after a resume replaces its file)."""
    folder.mkdir(parents=True, exist_ok=True)
    nt = batch.non_tensor_batch
    scores = batch.batch.get("token_level_scores")
    rows = []
    for i in range(len(batch)):
        row: dict[str, Any] = {"step": step}
        for key in ("index", "uid", "data_source", WEIGHT_VERSION_KEY):
            if key in nt:
                value = nt[key][i]
                row[key] = value.item() if hasattr(value, "item") else value
        if scores is not None:
            row["score"] = float(scores[i].sum())
        rows.append(json.dumps(row, default=str))
    tmp = folder / f".{step}.jsonl.tmp"
    tmp.write_text("".join(line + "\n" for line in rows), encoding="utf-8")
    os.replace(tmp, folder / f"{step}.jsonl")


def _fmt(metrics: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if k.startswith("val/"))


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[threading.Event]:
    """Turn the first Ctrl-C into a request to stop after the current step.

    Interrupting mid-step would leave workers that already applied (or are applying) this
    step's update while the driver's step counter and dataloader say otherwise, so the
    checkpoint could not be exact. The loop finishes the step, saves it and raises
    ``KeyboardInterrupt``; a second Ctrl-C interrupts at once, without saving.
    """
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event  # signal handlers can only be set from the main thread
        return

    from rlcore.workers.termination import STOP_SIGNALS, note_signal  # SIGTERM as Ctrl-C

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def request_stop(signum: int, frame: object) -> None:
        note_signal(signum)
        if event.is_set():
            raise KeyboardInterrupt
        event.set()
        log.warning("Ctrl-C: finishing the current step, then saving; Ctrl-C again stops now")

    for sig in STOP_SIGNALS:
        signal.signal(sig, request_stop)
    try:
        yield event
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: the handler was not installed from Python
                signal.signal(sig, handler)


def _row_extras(non_tensors: Mapping[str, Any], rows: int) -> list[dict[str, Any]]:
    """Each row's reward extras (``used_tool``, ...) from the reward manager's columns."""
    keys = [k for k in non_tensors if k not in ("score", "acc") and not k.startswith("score/")]
    return [{k: non_tensors[k][i] for k in keys} for i in range(rows)]
