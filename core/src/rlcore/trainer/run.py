"""``run_training``: the run around the driver loop.

What ``rlcore train`` calls once the config validated: it creates the run directory
(``trainer.run_dir``) with the resolved ``config.toml``, builds data, the per-role specs,
reward manager, algorithm and workers, resumes from a checkpoint (``trainer.resume``:
``"auto"`` takes ``<run_dir>/checkpoints/latest`` when there is one), runs
:meth:`rlcore.trainer.fit.Trainer.fit` (checkpoints every ``trainer.save_freq`` steps and at
the end), exports the final actor to ``<run_dir>/final_hf``, plots the curves when matplotlib
is installed and returns the exit code. torch and Ray load when a run starts.

A worker process lost during the fit (died or stopped responding) is replaced up to
``trainer.max_worker_restarts`` times (:mod:`rlcore.trainer.recovery`): a rollout on its own
pool in place, any other by building the workers again and resuming from the newest
checkpoint this run wrote, in the loop around :meth:`Trainer.fit` here.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlcore.checkpoint.space import disk_full
from rlcore.errors import RlcoreError, WorkerLostError

if TYPE_CHECKING:
    from rlcore.config import RunConfig
    from rlcore.plugins import PluginRegistry
    from rlcore.preflight import Preflight
    from rlcore.tracking.flops import MfuMeter
    from rlcore.trainer.builder import Workers
    from rlcore.trainer.specs import RunSpecs

log = logging.getLogger(__name__)

__all__ = ["FINAL_EXPORT_DIR", "ExportUnsupportedError", "prepare_run_dir", "run_training"]

CONFIG_FILE = "config.toml"
FINAL_EXPORT_DIR = "final_hf"  # under the run directory: the last actor, HF format


class ExportUnsupportedError(RlcoreError):
    """The actor's engine cannot write a Hugging Face folder (its ``export_hf`` said why)."""


def prepare_run_dir(config: RunConfig, *, resuming: bool = False) -> Path:
    """Create ``trainer.run_dir`` and write the resolved config into it.

    A fresh run renames a ``metrics.jsonl`` left by an earlier run (``metrics.<time>.jsonl``);
    a resumed one appends to it.
    """
    from rlcore.config import config_to_dict, dump_toml
    from rlcore.tracking import METRICS_FILE

    run_dir = Path(config.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(dump_toml(config_to_dict(config)), encoding="utf-8")
    old = run_dir / METRICS_FILE
    if old.exists() and not resuming:
        kept = run_dir / f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        old.rename(kept)
        log.warning("an earlier run's metrics were moved to %s", kept)
    return run_dir


def run_training(
    config: RunConfig,
    prepared: Preflight | None = None,
    *,
    registry: PluginRegistry | None = None,
) -> int:
    """Train with ``config`` (Ray started or joined here if not yet); returns the exit code.

    ``prepared``: what :func:`rlcore.preflight.preflight` loaded (tokenizer and datasets), so
    the CLI's checks are not followed by a second tokenization of the data. ``registry``:
    where the algorithm, rewards and the specs' components are looked up (None: the installed
    plugins); a component of an in-process plugin travels to the workers as its class.
    """
    import attrs
    import ray

    from rlcore.checkpoint import CHECKPOINTS_DIR, CheckpointManager
    from rlcore.config import config_to_dict, dump_toml
    from rlcore.data import build_datasets, build_loaders, load_tokenizer
    from rlcore.preflight.hub import resolve_hub_names
    from rlcore.preflight.reward_model import check_reward_model
    from rlcore.preflight.roles import check_extra_roles, check_placed_roles, check_reward_roles
    from rlcore.preflight.trackers import check_loggers
    from rlcore.tracking import Tracker
    from rlcore.trainer.builder import (
        build_algorithm,
        build_reward_manager,
        build_workers,
        total_training_steps,
    )
    from rlcore.trainer.elastic import ScaleWatcher
    from rlcore.trainer.faults import FaultInjector
    from rlcore.trainer.fit import Components, Trainer
    from rlcore.trainer.plan import build_loop_plan
    from rlcore.trainer.recovery import Recovery
    from rlcore.trainer.specs import build_generation_role_specs, build_specs, worker_settings
    from rlcore.workers.cluster import check_pools_before_ray, start_ray
    from rlcore.workers.worker import pin_torch_threads

    config = resolve_hub_names(config)  # Hub names to local folders, before Ray starts
    worker_settings(config).apply()  # the driver's own switches, as every worker's
    # The driver scores rewards and advantages: one thread is plenty.
    pin_torch_threads(config.resources.driver_num_threads)
    checkpoints = CheckpointManager(
        Path(config.trainer.run_dir) / CHECKPOINTS_DIR, keep_last=config.trainer.keep_last
    )
    resume_from = checkpoints.resolve_resume(config.trainer.resume)
    run_dir = prepare_run_dir(config, resuming=resume_from is not None)
    algorithm = build_algorithm(config, registry)
    check_extra_roles(config, algorithm.needs.extra_roles)  # one line before Ray starts
    judges = check_reward_roles(config, registry)  # a judge's model folder, likewise
    check_placed_roles(config, algorithm.needs.extra_roles, judges)  # placement's roles exist
    check_reward_model(config)  # [reward_model]: its folder, a sequence classifier
    check_pools_before_ray(config.resources)  # the pools fit this machine (local runs)
    check_loggers(config, registry)  # each tracker's server answers, its folder is writable
    if not ray.is_initialized():
        start_ray(config.resources)

    if prepared is None:
        tokenizer = load_tokenizer(
            config.model.tokenizer_path, require_chat_template=config.data.apply_chat_template
        )
        train_set, val_set = build_datasets(config, tokenizer)
    else:
        tokenizer, train_set, val_set = prepared.tokenizer, prepared.train_set, prepared.val_set
    train_loader, val_loader = build_loaders(config, train_set, val_set)
    total_steps = total_training_steps(config, len(train_loader))
    specs = build_specs(config, algorithm, total_steps, registry=registry)
    reward_manager = build_reward_manager(config, tokenizer, registry)
    try:
        # A batched reward's own models (a judge) run in roles beside the policy.
        specs = attrs.evolve(
            specs,
            generation_roles=build_generation_role_specs(
                config,
                reward_manager.roles(),
                settings=worker_settings(config),
                taken=list(specs.roles),
                registry=registry,
            ),
        )
        workers = build_workers(config, specs)
    except BaseException:
        reward_manager.close()
        raise
    config_dict = config_to_dict(config)  # for the loggers and the checkpoints' config.toml
    tracker = Tracker(
        run_dir,
        config.trainer.loggers,
        total_steps=total_steps,
        console_every=config.trainer.log_freq,
        start_step=_checkpoint_step(resume_from),
        experiment_name=config.trainer.experiment_name,
        config=config_dict,
        logger_options=config.trainer.logger_options,
        timeout_s=config.trainer.logger_timeout_s,
    )
    recovery = Recovery(
        config.trainer.max_worker_restarts, rollout_data_dir=config.trainer.rollout_data_dir
    )
    recovery.last_saved = resume_from
    current: Workers | None = workers  # what the end shuts down (None: already down)
    try:
        recovery.faults = FaultInjector.from_env()
        mfu = _mfu_meter(config, specs, workers)
        reward_manager.bind_roles(workers.generation_roles)
        while True:  # a lost worker: start the workers again, from the newest checkpoint
            trainer = Trainer(
                specs,
                build_loop_plan(config, total_steps, has_validation=val_loader is not None),
                Components(
                    policy=workers.policy,
                    critic=workers.critic,
                    roles=workers.roles,
                    reward_model=workers.reward_model,
                    algorithm=algorithm,
                    reward_manager=reward_manager,
                    train_loader=train_loader,
                    val_loader=val_loader,
                    tracker=tracker,
                    checkpoints=checkpoints,
                    world_size=workers.world_size,
                    config_text=dump_toml(config_dict),
                    mfu=mfu,
                    recovery=recovery,
                    # rlcore scale RUN_DIR rollout=N: the trajectory queue's replicas
                    scale=ScaleWatcher(run_dir) if specs.asynchronous is not None else None,
                ),
            )
            recovery.attach(workers)
            if recovery.recoveries:
                recovery.resume_point(trainer)
            elif resume_from is not None:
                trainer.restore(resume_from)
            else:
                recovery.remember_start(trainer)
            try:
                trainer.fit()
                break
            except WorkerLostError as err:
                recovery.recover_run(err, trainer)  # raises past trainer.max_worker_restarts
                current = None
                workers.shutdown()
                workers = build_workers(config, specs)
                current = workers
                reward_manager.bind_roles(workers.generation_roles)
        if config.trainer.export_final:
            export_dir = run_dir / FINAL_EXPORT_DIR
            try:
                reasons = [r for r in workers.policy.export_hf(str(export_dir)) if r]
            except Exception as err:  # a worker's error, delivered by Ray
                # A full disk is one line, as a save's is, not the worker's remote traceback.
                if disk_full(err, run_dir):
                    doing = f"exporting the final actor to {export_dir}"
                    raise checkpoints.disk_full_error(run_dir, doing) from err
                raise
            if reasons:
                msg = (
                    f"the final export failed: engine {config.actor.engine.name!r} cannot "
                    f"export a Hugging Face folder ({reasons[0]}); the run's checkpoints are "
                    "saved; set trainer.export_final = false to skip the export"
                )
                raise ExportUnsupportedError(msg)
            log.info("final actor exported to %s", export_dir)
        tracker.log_files(_plot(run_dir))
    except BaseException as err:
        # When the run ended, apart from the shutdown that follows (tests/test_liveness.py
        # times the two; the error itself is printed once everything has stopped).
        log.info("run ending (%s): stopping the workers and Ray", type(err).__name__)
        raise
    finally:
        tracker.close()
        reward_manager.close()
        if current is not None:
            current.shutdown()
    if recovery.restarts:
        log.warning("recovered from lost workers: %s", recovery.summary())
    log.info("run directory: %s", run_dir.resolve())
    return 0


def _checkpoint_step(path: Path | None) -> int:
    from rlcore.checkpoint import step_of

    return (step_of(path) or 0) if path is not None else 0


def _plot(run_dir: Path) -> list[Path]:
    """The run's plots (for the loggers that keep files); none without matplotlib."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        log.info("no plots: pip install matplotlib, then rlcore plot %s", run_dir)
        return []
    from rlcore.tracking.plotting import plot_run

    try:
        written = plot_run(run_dir)
    except RlcoreError as err:
        log.warning("plotting %s failed: %s", run_dir, err)
        return []
    except Exception as err:  # plots are a by-product: training is done, keep its exit code
        log.warning(
            "plotting %s failed (%s: %s); training is unaffected; rerun rlcore plot %s",
            run_dir,
            type(err).__name__,
            err,
            run_dir,
        )
        return []
    log.info("plots: %s", ", ".join(str(p) for p in written))
    return [Path(p) for p in written]


def _mfu_meter(config: RunConfig, specs: RunSpecs, workers: Workers) -> MfuMeter | None:
    """The policy's MFU meter: its model's shape, one worker's peak (a GPU's declared one, or
    this machine's matmul rate at a worker's torch threads, measured once and cached), and
    the processes of the update and of generation (the rollout's pool, when it has one)."""
    from rlcore.tracking.flops import mfu_meter
    from rlcore.trainer.placement import SplitPolicy

    actor = specs.policy.actor.spec
    policy = workers.policy
    return mfu_meter(
        actor.model_path,
        device=actor.device,
        dtype=actor.dtype,
        threads=max(1, int(config.resources.cpus_per_process)),
        update_ranks=workers.world_size,
        generate_ranks=(
            policy.rollout.world_size if isinstance(policy, SplitPolicy) else workers.world_size
        ),
    )
