"""``RunState``: the one map of what a checkpoint holds, saved and restored in one place.

torchtitan's ``states = {"model": ..., "optimizer": ..., "dataloader": ...}`` in our terms::

    RunState(
        counters=LoopCounters(total_steps=10),
        driver={"dataloader": loader, "algorithm": algorithm, "program": program},
        workers={"actor_rollout_ref": policy, "critic": critic, "teacher": teacher},
        files={"async_queue": queue},  # trainer.async_mode only
    )

``driver`` entries are :class:`Stateful` objects on the driver (``state_dict`` /
``load_state_dict``, JSON-able state); ``workers`` entries are worker groups whose every rank
writes its own shards (``save_checkpoint(path)`` / ``load_checkpoint(path)``), each under its
own folder of the checkpoint; ``files`` entries are driver objects that write files of their
own into the checkpoint folder (tensors a JSON table cannot hold: the asynchronous modes' queued
generations), saved after the workers. The driver's RNG and the step travel with them. Nothing
else is saved, so anything a step carries to the next must be in one of these entries — the
conformance rule ``step-resumable`` (:func:`rlcore.testing.conformance.check_step_program`)
checks an algorithm's program for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

__all__ = ["DATALOADER", "LoopCounters", "RunState", "Stateful", "WorkerState"]

log = logging.getLogger(__name__)

# The entry whose state is the checkpoint's ``dataloader`` table (trainer_state.json).
DATALOADER = "dataloader"


class Stateful(Protocol):
    """A driver object whose run state a checkpoint holds (JSON-able)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class WorkerState(Protocol):
    """A worker group whose ranks save and load their own shards under a checkpoint folder
    (or a driver object writing its own files there: ``RunState.files``)."""

    def save_checkpoint(self, path: str) -> Any: ...

    def load_checkpoint(self, path: str) -> Any: ...


@attrs.define
class LoopCounters:
    """What the loop advances. ``step`` counts completed training steps."""

    total_steps: int
    step: int = 0
    nonfinite_in_a_row: int = 0
    resumed_from: int | None = None  # the checkpoint step this run started from


@attrs.define
class RunState:
    """The loop's counters, the driver's stateful objects and the workers; see the module doc."""

    counters: LoopCounters
    driver: dict[str, Stateful]
    workers: dict[str, WorkerState] = attrs.Factory(dict)
    files: dict[str, WorkerState] = attrs.Factory(dict)

    def save(self, directory: Path, *, config_text: str) -> None:
        """Write everything into ``directory`` (a checkpoint's temporary folder).

        Workers write their shards straight into it (same host, or a shared filesystem across
        nodes); the checkpoint manager fsyncs and renames it.
        """
        from rlcore.checkpoint import CONFIG_FILE, capture_rng_state, save_driver_state

        for group in [*self.workers.values(), *self.files.values()]:
            group.save_checkpoint(str(directory))
        save_driver_state(
            directory,
            step=self.counters.step,
            dataloader_state=self.driver[DATALOADER].state_dict(),
            extra={
                name: obj.state_dict() for name, obj in self.driver.items() if name != DATALOADER
            },
            rng=capture_rng_state(),
        )
        (directory / CONFIG_FILE).write_text(config_text, encoding="utf-8")

    def restore(self, path: Path) -> None:
        """Load checkpoint ``path`` into every entry, then the RNG and the step."""
        from rlcore.checkpoint import CheckpointError, load_driver_state, restore_rng_state

        saved = load_driver_state(path)
        counters = self.counters
        if saved.step > counters.total_steps:
            msg = (
                f"checkpoint {path} is at step {saved.step}, past this run's "
                f"{counters.total_steps} steps: raise trainer.total_steps or set "
                'trainer.resume = "off"'
            )
            raise CheckpointError(msg)
        for name, obj in self.driver.items():
            state: Mapping[str, Any] = (
                saved.dataloader if name == DATALOADER else saved.extra.get(name) or {}
            )
            if state:  # an entry with nothing saved keeps its fresh state
                obj.load_state_dict(dict(state))
        for group in [*self.workers.values(), *self.files.values()]:
            group.load_checkpoint(str(path))
        if saved.rng is not None:
            restore_rng_state(saved.rng)
        counters.step = saved.step
        counters.resumed_from = saved.step
        log.info("resumed from %s at step %d", path, saved.step)
