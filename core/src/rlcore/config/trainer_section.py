"""The ``[trainer]`` section: the run's length, validation, checkpoints, logging and how stale an
asynchronous sample may be."""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs import validators as v

from rlcore.config.fields import RESOLVED, _nonempty, _opt_pos, _pos
from rlcore.interfaces import (
    POLL_MAX_S,
    key,
    seconds,
)
from rlcore.tracking.bounds import DEFAULT_TIMEOUT_S as DEFAULT_LOGGER_TIMEOUT_S


def _staleness(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < 0:
        msg = f"must be >= 0 (weight versions a trained sample may lag the actor by), got {value}"
        raise ValueError(msg)


def _loggers(_inst: object, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    # Which names exist is the plugin registry's to say (the loader checks each one).
    for name in value:
        if value.count(name) > 1:
            msg = f"logger {name!r} is listed twice"
            raise ValueError(msg)


@attrs.frozen(kw_only=True)
class TrainerConfig:
    """``[trainer]``: length, validation, checkpoints, logging."""

    total_steps: int | None = key(
        None, "Training steps of the run; set this or total_epochs, not both.", validator=_opt_pos
    )
    total_epochs: int | None = key(
        None,
        "Passes over the training prompts; 1 when neither it nor total_steps is set.",
        validator=_opt_pos,
    )
    test_freq: int = key(
        0,
        "Validate every N steps and after the last one; 0: no periodic validation.",
        validator=v.ge(0),
    )
    val_before_train: bool = key(True, "Validate once before the first step (not on resume).")
    save_freq: int = key(
        0,
        "Save a checkpoint every N steps (and after the last); 0: only at the end.",
        validator=v.ge(0),
    )
    resume: str = key(
        "auto",
        '"auto": resume from the run directory\'s latest checkpoint if any; '
        '"off": start over; or a checkpoint path.',
        validator=_nonempty,
    )
    keep_last: int | None = key(
        None, "Checkpoints kept (older ones deleted); unset: keep all.", validator=_opt_pos
    )
    export_final: bool = key(
        True, "Export the final actor as a Hugging Face folder: <run_dir>/final_hf."
    )
    check_finite_on_resume: bool = key(
        True,
        "Before a resume, read the checkpoint's model weights and refuse one holding NaN or "
        "inf, naming the tensor (false: load it as it is).",
    )
    max_consecutive_nonfinite: int = key(
        3,
        "Consecutive steps with a non-finite loss or gradient (each skipped) before the run stops.",
        validator=_pos,
    )
    max_worker_restarts: int = key(
        3,
        "Worker processes lost (died, or stopped responding) that the run replaces before it "
        "stops: a rollout on its own pool in place, any other role by restarting the workers "
        "from the newest checkpoint (docs/fault-tolerance.md). 3: enough for the odd "
        "preempted or OOM-killed process, few enough that a failure which recurs stops the "
        "run within minutes; 0: stop at the first, as before.",
        validator=v.ge(0),
    )
    grad_norm_ceiling: float | None = key(
        None,
        "Divergence guard: a step whose actor or critic gradient norm (before "
        "clipping) exceeds this stops the run unsaved; unset: no ceiling.",
        validator=v.optional(v.gt(0.0)),
    )
    auto_padding: bool = key(
        False,
        "DataProto auto-padding in the driver and every worker: chunk() may split "
        "a batch unevenly (verl's VERL_AUTO_PADDING).",
    )
    experiment_name: str = key(
        "rlcore", "Name of the run (run directory, loggers).", validator=_nonempty
    )
    run_dir: str = key(
        RESOLVED,
        "Directory of checkpoints, metrics and the exported model.",
        shown_default="runs/<experiment_name>",
    )
    seed: int = key(0, "Seed of the workers and rollouts (each rank offsets it), in [0, 2**32).")
    loggers: tuple[str, ...] = key(
        ("console", "jsonl"),
        "Logger plugins: the core's console, jsonl, tensorboard; rlcore-wandb, rlcore-mlflow, ...",
        validator=_loggers,
    )
    logger_options: dict[str, Any] = key(
        factory=dict,
        help="[trainer.logger_options.NAME]: each selected logger's own options "
        "(listed per plugin below).",
    )
    logger_timeout_s: float = key(
        DEFAULT_LOGGER_TIMEOUT_S,
        "Time limit of each call of a logger (one step's metrics, the plots, its start and "
        "close) and of its destination's check before Ray; past it the run goes on without "
        "that logger's metrics (counted, one warning) until the late call returns.",
        # The check's socket polls (a C int of ms); the calls are joined threads.
        validator=seconds(POLL_MAX_S, "a socket's poll, a C int of ms"),
    )
    log_freq: int = key(1, "Print the console table every N steps.", validator=_pos)
    # fully_async is verl's recipe/fully_async_policy (docs/placement.md).
    async_mode: Literal["off", "one_step_off", "fully_async"] = key(
        "off",
        "one_step_off: the rollout (on a pool of its own, resources.placement) "
        "generates batch k+1 while the trainer trains on batch k (staleness 1); "
        "fully_async: a trajectory queue, the rollout up to trainer.max_staleness batches "
        "ahead.",
        validator=v.in_(("off", "one_step_off", "fully_async")),
    )
    max_staleness: int = key(
        1,
        "fully_async: weight versions a trained sample may lag the actor by (>= 0); "
        "the rollout generates up to this many batches ahead (0: synchronous).",
        validator=_staleness,
    )
    staleness_policy: Literal["drop", "reweight"] = key(
        "drop",
        "fully_async, samples older than max_staleness: drop (regenerate them with "
        "the current weights) or reweight (train them; needs algorithm.rollout_is).",
        validator=v.in_(("drop", "reweight")),
    )
    rollout_data_dir: str | None = key(
        None,
        "Write each trained step's samples (prompt index, uid, data source, weight "
        "version, score) to DIR/<step>.jsonl (verl's trainer.rollout_data_dir).",
    )
