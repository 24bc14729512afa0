"""The checkpoint of a frozen model's worker (an extra role, the reward model).

The model never changes from its ``model.path``, so a checkpoint keeps only which model it
was (the rank's state map in the worker's own folder): a resume with another model is caught,
naming the key, instead of silently training against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.dispatch import Dispatch, register
from rlcore.workers import RoleWorker

__all__ = ["FrozenModelWorker"]


class FrozenModelWorker(RoleWorker):
    """A :class:`~rlcore.workers.RoleWorker` whose ``spec.engine.spec.model_path`` is frozen.

    A subclass says, per instance, its checkpoint folder and role name (``checkpoint_role``),
    what it is and the key of its model path in a sentence (``frozen_model``: e.g.
    ``("the reward model", "reward_model.model.path")``).
    """

    def checkpoint_role(self) -> str:
        raise NotImplementedError

    def frozen_model(self) -> tuple[str, str]:
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        return {"role": self.checkpoint_role(), "model_path": self.spec.engine.spec.model_path}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        from rlcore.checkpoint import save_worker_state

        save_worker_state(Path(path) / self.checkpoint_role(), self.rank, self._state())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        from rlcore.checkpoint import CheckpointError, load_worker_state

        saved = load_worker_state(Path(path) / self.checkpoint_role(), self.rank)
        if dict(saved) != self._state():
            what, key = self.frozen_model()
            msg = (
                f"checkpoint {path} was written with {what} at {saved.get('model_path')!r}; "
                f"this run's {key} is {self._state()['model_path']!r}"
            )
            raise CheckpointError(msg)
