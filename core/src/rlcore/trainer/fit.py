"""The driver loop: one process writes the algorithm as a plain for-loop over batches.

    for batch in dataloader:
        batch    = batch.repeat(n)                                # rows: n per prompt, once
        gen      = policy.generate_sequences(batch, sampling)     # one response per row
        batch    = batch.union(gen)
        batch   |= policy.compute_log_prob(batch)                 # old log π
        batch   |= policy.compute_ref_log_prob(batch)             # if the algorithm needs KL
        batch   |= critic.compute_values(batch)                   # if it needs a critic
        batch   |= reward_manager(batch)                          # token-level scores
        batch    = algorithm.compute_advantages(batch)            # on the driver
        critic.update_critic(layout(batch), step); policy.update_actor(layout(batch), step)

Validation (greedy by default, ``[rollout.val]``) runs before training and every
``test_freq`` steps, and reports ``val/<data_source>/score`` and ``val/<data_source>/acc``.

The loop's state lives in :class:`LoopState` and :meth:`Trainer.state_dict` (step,
dataloader position, the algorithm's driver state). Checkpoints (``trainer.save_freq``, and
always after the last step) hold that, the driver's RNG, the resolved config and the
workers' engine state (see :mod:`rlcore.checkpoint` for the layout); :meth:`Trainer.restore`
loads one. A step whose update was non-finite (loss or gradient) is skipped by the engine
and reported (``actor/nonfinite``); ``MAX_CONSECUTIVE_NONFINITE`` of them in a row stop the
run with :class:`NonFiniteError` before anything is saved.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from rlcore.errors import RlcoreError
from rlcore.tracking.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    timed,
    timing_metrics,
)
from rlcore.trainer import divergence
from rlcore.trainer.layout import mini_batch_layout
from rlcore.trainer.mismatch import logprob_diff_metrics
from rlcore.trainer.roles import ACTOR_MESH, CRITIC_MESH, POLICY_INPUT_KEYS

if TYPE_CHECKING:
    from rlcore.checkpoint import CheckpointManager
    from rlcore.config import RunConfig
    from rlcore.data import PromptDataLoader
    from rlcore.dispatch import DispatchInfo
    from rlcore.interfaces import BaseAlgorithm
    from rlcore.protocol import DataProto
    from rlcore.reward import RewardManager
    from rlcore.tracking import Tracker
    from rlcore.trainer.specs import RunSpecs, UpdateSpec
    from rlcore.workers import RayWorkerGroup

log = logging.getLogger(__name__)

__all__ = [
    "MAX_CONSECUTIVE_NONFINITE",
    "LoopState",
    "NonFiniteError",
    "Trainer",
    "reduce_worker_metrics",
]

# Consecutive steps with a non-finite loss or gradient before the run stops; the default of
# ``trainer.max_consecutive_nonfinite``.
MAX_CONSECUTIVE_NONFINITE = 3

# Per-step flags the workers report: > 0 when an optimizer update was skipped.
_NONFINITE_KEYS = ("actor/nonfinite", "critic/nonfinite")


class NonFiniteError(RlcoreError):
    """Too many consecutive steps had a non-finite loss or gradient."""


# The rollout's inputs, taken out of the (already expanded) prompt batch.
_PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


@attrs.define
class LoopState:
    """Everything the loop advances. ``step`` counts completed training steps."""

    step: int = 0
    total_steps: int = 0
    nonfinite_in_a_row: int = 0
    resumed_from: int | None = None  # the checkpoint step this run started from


def reduce_worker_metrics(metrics: Mapping[str, Sequence[float] | float]) -> dict[str, float]:
    """Per-rank (and per-mini-batch) lists -> one float: mean, but max for worker times
    and for keys ending in ``_max`` (a maximum over ranks is the largest rank's).

    The driver waits for the slowest rank, so its time is the one that adds up to the step.
    """
    out: dict[str, float] = {}
    for key, values in metrics.items():
        if isinstance(values, int | float):
            out[key] = float(values)
        elif values:
            arr = np.asarray(values, dtype=np.float64)
            biggest = key.startswith("timing_s/") or key.endswith("_max")
            out[key] = float(arr.max() if biggest else arr.mean())
    return out


def _take_metrics(data: DataProto) -> dict[str, float]:
    """Pop a worker output's merged metrics (so they do not travel on with the batch)."""
    return reduce_worker_metrics(data.meta_info.pop("metrics", None) or {})


def _add_timing(into: dict[str, float], new: Mapping[str, float]) -> None:
    """Worker phase times of several calls in one step add up (e.g. two forward passes)."""
    for key, value in new.items():
        if key.startswith("timing_s/worker/"):
            into[key] = into.get(key, 0.0) + value
        else:
            into[key] = value


class Trainer:
    """Runs :meth:`fit`; built by :func:`rlcore.trainer.run_training` from a config."""

    def __init__(
        self,
        config: RunConfig,
        *,
        specs: RunSpecs,
        policy: RayWorkerGroup,
        critic: RayWorkerGroup | None,
        algorithm: BaseAlgorithm,
        reward_manager: RewardManager,
        train_loader: PromptDataLoader,
        val_loader: PromptDataLoader | None,
        tracker: Tracker,
        total_steps: int,
        world_size: int = 1,
        checkpoints: CheckpointManager | None = None,
        max_consecutive_nonfinite: int = MAX_CONSECUTIVE_NONFINITE,
    ) -> None:
        self.config = config
        self.specs = specs
        self.policy = policy
        self.critic = critic
        self.algorithm = algorithm
        self.reward_manager = reward_manager
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.tracker = tracker
        self.world_size = world_size
        self.checkpoints = checkpoints
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        self.state = LoopState(step=0, total_steps=total_steps)
        self.last_metrics: dict[str, float] = {}
        self._last_model_in: DataProto | None = None

    # --- state (what a checkpoint holds) --------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The driver's run state: step, dataloader position, the algorithm's state."""
        return {
            "step": self.state.step,
            "dataloader": self.train_loader.state_dict(),
            "algorithm": self.algorithm.state_dict(),
        }

    def save_checkpoint(self) -> Path | None:
        """Write ``global_step_<step>`` (driver state, config, workers' engines) atomically."""
        if self.checkpoints is None:
            return None
        from rlcore.checkpoint import CONFIG_FILE, capture_rng_state, save_driver_state
        from rlcore.config import config_to_dict, dump_toml

        driver = self.state_dict()

        def write(tmp: Path) -> None:
            # Workers write their shards straight into the temporary directory (same host,
            # or a shared filesystem across nodes); the manager fsyncs and renames it.
            self.policy.save_checkpoint(str(tmp))
            if self.critic is not None:
                self.critic.save_checkpoint(str(tmp))
            save_driver_state(
                tmp,
                step=driver["step"],
                dataloader_state=driver["dataloader"],
                extra={"algorithm": driver["algorithm"]},
                rng=capture_rng_state(),
            )
            text = dump_toml(config_to_dict(self.config))
            (tmp / CONFIG_FILE).write_text(text, encoding="utf-8")

        return self.checkpoints.save(self.state.step, write)

    def restore(self, path: Path) -> None:
        """Load checkpoint ``path``: step, dataloader, algorithm, RNG and the workers' state."""
        from rlcore.checkpoint import CheckpointError, load_driver_state, restore_rng_state

        driver = load_driver_state(path)
        if driver.step > self.state.total_steps:
            msg = (
                f"checkpoint {path} is at step {driver.step}, past this run's "
                f"{self.state.total_steps} steps: raise trainer.total_steps or set "
                'trainer.resume = "off"'
            )
            raise CheckpointError(msg)
        self.train_loader.load_state_dict(driver.dataloader)
        algo_state = driver.extra.get("algorithm") or {}
        if algo_state:
            self.algorithm.load_state_dict(algo_state)
        self.policy.load_checkpoint(str(path))
        if self.critic is not None:
            self.critic.load_checkpoint(str(path))
        if driver.rng is not None:
            restore_rng_state(driver.rng)
        self.state.step = driver.step
        self.state.resumed_from = driver.step
        log.info("resumed from %s at step %d", path, driver.step)

    # --- the loop -------------------------------------------------------------------------

    def fit(self) -> dict[str, float]:
        """Train up to ``total_steps``; returns the last step's metrics.

        Saves every ``trainer.save_freq`` steps and after the last one. A resumed run does
        not validate before training again (its first run did, at that step's weights).
        """
        cfg = self.config.trainer
        state = self.state
        if cfg.val_before_train and self.val_loader is not None and state.resumed_from is None:
            val = self.validate()
            self.tracker.log(val, step=state.step)
            log.info("validation before training: %s", _fmt(val))
        with _deferred_interrupt() as interrupted:
            while state.step < state.total_steps:
                for batch in self.train_loader:
                    metrics = self.train_step(batch)
                    state.step += 1
                    last = state.step >= state.total_steps
                    self._check_finite(metrics)
                    divergence.check_grad_norm(metrics, state.step, cfg.grad_norm_ceiling)
                    if (
                        self.val_loader is not None
                        and cfg.test_freq
                        and (state.step % cfg.test_freq == 0 or last)
                    ):
                        metrics |= self.validate()
                    metrics["training/epoch"] = float(batch.meta_info.get("epoch", 0))
                    self.tracker.log(metrics, step=state.step)
                    self.last_metrics = metrics
                    if (
                        last
                        or interrupted.is_set()
                        or (cfg.save_freq and state.step % cfg.save_freq == 0)
                    ):
                        # Never save diverged weights: score the batch with them first.
                        divergence.check_policy_finite(self.policy, self._last_model_in, state.step)
                        self.save_checkpoint()
                    if interrupted.is_set():
                        log.warning("interrupted: saved step %d, stopping", state.step)
                        raise KeyboardInterrupt
                    if last:
                        break
        if state.resumed_from is not None and state.resumed_from >= state.total_steps:
            log.info("checkpoint step %d is the last step: nothing left to train", state.step)
        return self.last_metrics

    def _check_finite(self, metrics: dict[str, float]) -> None:
        """Count steps whose update was skipped; stop (before any save) after too many."""
        state = self.state
        skipped = any(
            not math.isfinite(metrics.get(key, 0.0)) or metrics.get(key, 0.0) > 0
            for key in _NONFINITE_KEYS
        )
        metrics["training/nonfinite_step"] = 1.0 if skipped else 0.0
        if not skipped:
            state.nonfinite_in_a_row = 0
            return
        state.nonfinite_in_a_row += 1
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row, stop at %d)",
            state.step,
            state.nonfinite_in_a_row,
            self.max_consecutive_nonfinite,
        )
        if state.nonfinite_in_a_row >= self.max_consecutive_nonfinite:
            # Log the failing step first so metrics.jsonl shows it, then stop unsaved.
            metrics["training/epoch"] = float(self.train_loader.state_dict()["epoch"])
            self.tracker.log(metrics, step=state.step)
            msg = (
                f"{state.nonfinite_in_a_row} consecutive steps had a non-finite loss or "
                f"gradient (last at step {state.step}); stopping without saving the bad "
                "state. Lower actor.optim.lr (or critic.optim.lr), set actor.grad_clip, or "
                "check the data and rewards; resume from the last checkpoint"
            )
            raise NonFiniteError(msg)

    def train_step(self, batch: DataProto) -> dict[str, float]:
        """One step: generate, score, advantages, update. Returns the step's metrics."""
        specs, step = self.specs, self.state.step
        timing: dict[str, float] = {}
        worker: dict[str, float] = {}
        with timed("step", timing):
            # --- n rows per prompt (here, once), one response per row ----------------------
            batch = batch.repeat(specs.n, interleave=True)
            prompts = batch.pop(batch_keys=_PROMPT_KEYS)
            with timed("gen", timing):
                gen = self.policy.generate_sequences(prompts, specs.train_sampling)
            _add_timing(worker, _take_metrics(gen))
            batch = batch.union(gen)
            model_in = self._select(batch, POLICY_INPUT_KEYS)
            self._last_model_in = model_in  # the divergence guard rescores it before a save

            # --- old log-probs, reference log-probs, values ----------------------------------
            mismatch: dict[str, float] = {}  # rollout vs engine log-probs (trainer/mismatch.py)
            if not specs.policy.reuse_old_log_probs:  # on-policy: the update's forward has them
                with timed("old_log_prob", timing):
                    out = self.policy.compute_log_prob(model_in)
                _add_timing(worker, _take_metrics(out))
                batch.union(out)
                if "rollout_log_probs" in batch.batch:  # else the update's forward tallies it
                    mismatch = logprob_diff_metrics(
                        batch.batch["old_log_probs"],
                        batch.batch["rollout_log_probs"],
                        batch.batch["response_mask"],
                    )
            if specs.policy.ref is not None:  # the algorithm's needs.reference decided it
                with timed("ref", timing):
                    out = self.policy.compute_ref_log_prob(model_in)
                _add_timing(worker, _take_metrics(out))
                batch.union(out)
            if self.critic is not None:
                with timed("values", timing):
                    out = self.critic.compute_values(model_in)
                _add_timing(worker, _take_metrics(out))
                batch.union(out)

            # --- reward (driver) -------------------------------------------------------------
            with timed("reward", timing):
                scores, reward_metrics = self.reward_manager(batch)
                batch.union(scores)

            # --- advantages (driver) ---------------------------------------------------------
            with timed("adv", timing):
                batch, kl_metrics = self.algorithm.compute_rewards(batch)
                batch = self.algorithm.compute_advantages(batch)

            # --- updates ---------------------------------------------------------------------
            update_keys: tuple[str, ...] = (*POLICY_INPUT_KEYS, "advantages")
            for key in ("old_log_probs", "rollout_log_probs"):  # rollout_is and mismatch
                if key in batch.batch:
                    update_keys = (*update_keys, key)
            if self.critic is not None and specs.critic is not None:
                critic_keys = (*POLICY_INPUT_KEYS, "values", "returns")
                critic_in = self._laid_out(
                    batch, critic_keys, specs.critic.update, self.critic.dispatch_info(CRITIC_MESH)
                )
                with timed("update_critic", timing):
                    out = self.critic.update_critic(critic_in, step)
                _add_timing(worker, _take_metrics(out))
            if specs.policy.ref is not None:
                update_keys = (*update_keys, "ref_log_prob")
            actor_in = self._laid_out(
                batch, update_keys, specs.policy.update, self.policy.dispatch_info(ACTOR_MESH)
            )
            with timed("update_actor", timing):
                out = self.policy.update_actor(actor_in, step)
            _add_timing(worker, _take_metrics(out))

        return {
            **worker,
            **mismatch,
            **reward_metrics,
            **kl_metrics,
            **compute_data_metrics(batch),
            **timing_metrics(timing),
            **compute_throughput_metrics(batch, timing, n_workers=self.world_size),
        }

    @staticmethod
    def _select(batch: DataProto, keys: Sequence[str]) -> DataProto:
        """Only the tensors a worker call needs: per-row strings and dicts stay here."""
        return batch.select(batch_keys=list(keys), non_tensor_batch_keys=[])

    def _laid_out(
        self,
        batch: DataProto,
        keys: Sequence[str],
        update: UpdateSpec,
        mesh: Sequence[DispatchInfo],
    ) -> DataProto:
        """The update's rows: whole mini-batches per data-parallel rank of the role's ``mesh``
        (its engine's ``dispatch_info``; tensor-parallel ranks share rows), zero-weight padding
        (layout.py)."""
        return mini_batch_layout(
            self._select(batch, keys),
            rows_per_mini_batch=update.rows_per_mini_batch,
            world_size=mesh[0].dp_size,
            balance_tokens=update.balance_tokens,
        )

    # --- validation -----------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """Generate on the validation set (``[rollout.val]`` sampling) and score it.

        Returns ``val/<data_source>/score`` and ``val/<data_source>/acc`` (means over all
        samples of that source), ``timing_s/validate`` and, with ``[agent]``, the agent
        metrics of the validation conversations (``val/agent/tool_use_rate``, ...).
        """
        if self.val_loader is None:
            return {}
        timing: dict[str, float] = {}
        sources: list[str] = []
        scores: list[float] = []
        accs: list[float] = []
        lengths: list[float] = []
        agent: dict[str, list[float]] = {}  # [agent] runs: tool use under validation sampling
        with timed("validate", timing):
            for batch in self.val_loader:
                batch = batch.repeat(self.specs.val_n, interleave=True)
                prompts = batch.pop(batch_keys=_PROMPT_KEYS)
                gen = self.policy.generate_sequences(prompts, self.specs.val_sampling)
                for key, value in _take_metrics(gen).items():
                    if key.startswith("agent/"):
                        agent.setdefault(key, []).append(value)
                batch = batch.union(gen)
                out, _ = self.reward_manager(batch)
                sources += [str(s) for s in batch.non_tensor_batch["data_source"]]
                scores += [float(s) for s in out.non_tensor_batch["score"]]
                accs += [float(bool(a)) for a in out.non_tensor_batch["acc"]]
                lengths += batch.batch["response_mask"].sum(-1).float().tolist()
        src = np.asarray(sources, dtype=object)
        score_arr, acc_arr = np.asarray(scores), np.asarray(accs)
        metrics: dict[str, float] = {}
        for ds in sorted(set(sources)):
            sel = src == ds
            metrics[f"val/{ds}/score"] = float(score_arr[sel].mean())
            metrics[f"val/{ds}/acc"] = float(acc_arr[sel].mean())
        if lengths:
            metrics["val/response_length/mean"] = float(np.mean(lengths))
        for key, values in agent.items():
            metrics[f"val/{key}"] = float(np.mean(values))
        metrics |= timing_metrics(timing)
        return metrics


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
