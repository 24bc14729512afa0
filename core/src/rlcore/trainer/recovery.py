"""Runs that survive their workers: the driver's count of restarts and its way back.

Two ways back from a lost worker (a :class:`~rlcore.errors.WorkerLostError`: a process that
died or stopped responding; a worker's own exception is not retried, it would recur):

- **In place**, a rollout on a pool of its own (:meth:`SplitPolicy.replace_rollout
  <rlcore.trainer.placement.SplitPolicy.replace_rollout>`): the rollout group is killed and
  started again in its bundles, the current weights cross the bridge, and the prompts it held
  are generated again. No step is redone. With several rollout replicas (``rlcore scale``)
  a lost one is dropped instead, its batches generated on the others, no restart spent.
- **From the newest checkpoint**, every other role (the actor, critic, reference, an extra
  role, and a colocated rollout, which shares the actor's process): :func:`recover_run`
  shuts every worker down, and the same ``rlcore train`` builds them again, restores the
  checkpoint this run wrote last (or its starting state when it wrote none) and goes on. The
  steps trained since are trained again: ``fault/redone_steps``.

Both spend one of ``trainer.max_worker_restarts``; past it the run stops with the lost
worker's line (which names the role, rank, pid and the cause), its checkpoints untouched.

``trainer.rollout_data_dir`` after a recovery from a checkpoint: the samples of the steps
that are redone move to ``<dir>/abandoned/<n>/<step>.jsonl`` (the ``n``-th recovery), so the
``<dir>/<step>.jsonl`` files are exactly the samples the final weights were trained on: each
prompt once per epoch (tests/test_recovery.py audits that).

Metrics (every step): ``fault/worker_restarts``, ``fault/redone_steps`` (steps trained again
after recoveries, in all) and ``fault/lost_samples`` (samples a replaced rollout held that
were not generated again: 0 unless something is wrong).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.errors import WorkerLostError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from rlcore.trainer.builder import Workers
    from rlcore.trainer.faults import FaultInjector
    from rlcore.trainer.fit import Trainer

log = logging.getLogger(__name__)

__all__ = ["Recovery", "RestartsExhaustedError", "process_table"]


class RestartsExhaustedError(WorkerLostError):
    """A worker was lost with no restart left: the lost worker's line, the count added."""


class Recovery:
    """The run's restart budget and fault counters, shared by both ways back (module doc)."""

    def __init__(
        self,
        max_restarts: int,
        *,
        rollout_data_dir: str | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        self.max_restarts = max_restarts
        self.rollout_data_dir = Path(rollout_data_dir) if rollout_data_dir else None
        self.faults = faults
        self.restarts = 0
        self.redone_steps = 0
        self.lost_samples = 0
        self.recoveries = 0  # from a checkpoint (the rollout_data_dir folder's number)
        self.last_saved: Path | None = None  # the newest checkpoint this run wrote or began at
        self._start: dict[str, Any] | None = None  # the driver's state at step 0

    # --- the budget -----------------------------------------------------------------------

    def spend(self, err: WorkerLostError) -> None:
        """Count one restart for ``err``; past the budget, raise its line with the count."""
        if isinstance(err, RestartsExhaustedError):  # the budget's own verdict, on its way up
            raise err
        if self.restarts >= self.max_restarts:
            first, _, rest = str(err).partition("\n")
            msg = (
                f"{first} (after {self.restarts} worker restart(s); trainer.max_worker_restarts"
                f" = {self.max_restarts}); the last checkpoint is intact"
            )
            final = RestartsExhaustedError(msg + ("\n" + rest if rest else ""))
            final.role = err.role
            raise final from err
        self.restarts += 1
        log.warning(
            "worker restart %d of %d (trainer.max_worker_restarts): %s",
            self.restarts,
            self.max_restarts,
            str(err).partition("\n")[0],
        )

    def metrics(self) -> dict[str, float]:
        return {
            "fault/worker_restarts": float(self.restarts),
            "fault/redone_steps": float(self.redone_steps),
            "fault/lost_samples": float(self.lost_samples),
        }

    def summary(self) -> str:
        """For the run's closing line."""
        return (
            f"{self.restarts} worker restart(s), {self.redone_steps} step(s) redone, "
            f"{self.lost_samples} sample(s) lost"
        )

    # --- a run's attempts -----------------------------------------------------------------

    def attach(self, workers: Workers) -> None:
        """Bind an attempt's workers: the faults' targets, the rollout's restarts."""
        from rlcore.trainer.placement import SplitPolicy

        if self.faults is not None:
            self.faults.resolve = lambda role: process_table(workers, role)
        if isinstance(workers.policy, SplitPolicy):
            workers.policy.recovery = self

    def remember_start(self, trainer: Trainer) -> None:
        """The driver's state before step 1 of a run that starts from nothing, for a
        recovery before the first checkpoint (fresh workers hold the starting weights)."""
        from rlcore.checkpoint import capture_rng_state

        driver = {name: obj.state_dict() for name, obj in trainer.state.driver.items()}
        self._start = {"driver": driver, "rng": capture_rng_state()}

    def resume_point(self, trainer: Trainer) -> Path | None:
        """Restore a new attempt's ``trainer``: the newest checkpoint of this run, else the
        remembered start (returns None then)."""
        if self.last_saved is not None:
            trainer.restore(self.last_saved)
            return self.last_saved
        from rlcore.checkpoint import restore_rng_state

        assert self._start is not None, "remember_start() before the first attempt"
        for name, obj in trainer.state.driver.items():
            state = self._start["driver"].get(name)
            if state:
                obj.load_state_dict(dict(state))
        restore_rng_state(self._start["rng"])
        trainer.state.counters.resumed_from = 0  # validated before step 1 already
        log.info("no checkpoint yet: training again from step 0")
        return None

    def recover_run(self, err: WorkerLostError, trainer: Trainer) -> None:
        """After ``err`` ended an attempt: spend a restart (or raise past the budget), count
        the steps that will be trained again and set their samples aside."""
        from rlcore.checkpoint import step_of

        self.spend(err)
        self.recoveries += 1
        done = trainer.state.counters.step
        back_to = (step_of(self.last_saved) or 0) if self.last_saved is not None else 0
        redone = max(0, done - back_to)
        self.redone_steps += redone
        log.warning(
            "recovering from %s: training from step %d again (%d completed step(s) redone)",
            self.last_saved or "the run's start",
            back_to + 1,
            redone,
        )
        if self.rollout_data_dir is not None:
            self._set_aside(back_to)

    def _set_aside(self, back_to: int) -> None:
        """Move the samples of steps after ``back_to`` to ``abandoned/<n>/``."""
        folder = self.rollout_data_dir
        assert folder is not None
        later = [f for f in folder.glob("*.jsonl") if f.stem.isdigit() and int(f.stem) > back_to]
        if not later:
            return
        aside = folder / "abandoned" / str(self.recoveries)
        aside.mkdir(parents=True, exist_ok=True)
        for file in later:
            shutil.move(str(file), aside / file.name)


def process_table(workers: Workers, role: str) -> Sequence[Mapping[str, Any]]:
    """The processes (``process_info``, per rank) that run ``role`` now: for the fault
    injector, which signals them (:mod:`rlcore.trainer.faults`)."""
    from rlcore.trainer.placement import SplitPolicy

    policy = workers.policy
    if isinstance(policy, SplitPolicy):
        if role == "rollout":  # every replica's ranks in turn: rank k of 1-process replicas
            return [info for rep in policy.replicas for info in rep.group.process_info]
        group = policy.trainer
    else:
        group = policy
    if role == "critic" and workers.critic is not None:
        group = workers.critic
    elif role in workers.roles:
        group = workers.roles[role]
    elif role == "rm" and workers.reward_model is not None:
        group = workers.reward_model
    info: Sequence[Mapping[str, Any]] = group.process_info
    return info
