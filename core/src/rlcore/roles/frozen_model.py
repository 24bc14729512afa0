"""A frozen model's worker (an extra role, the reward model): one engine, and its checkpoint.

The worker builds its engine from ``spec.engine`` and declares the engine's place on the
role's mesh. The model never changes from its ``model.path``, so a checkpoint keeps only
which model it was (the rank's state map in the worker's own folder): a resume with another
model is caught, naming the key, instead of silently training against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.dispatch import Dispatch, register
from rlcore.workers import RoleWorker

if TYPE_CHECKING:
    from rlcore.interfaces import BaseEngine

__all__ = ["FrozenModelWorker"]


class FrozenModelWorker(RoleWorker):
    """A :class:`~rlcore.workers.RoleWorker` holding one engine (``spec.engine``, built by
    :meth:`_start_engine` in the subclass's ``init_model``) of a frozen model.

    A subclass says, per instance, its checkpoint folder and role name (``checkpoint_role``),
    what it is and the key of its model path in a sentence (``frozen_model``: e.g.
    ``("the reward model", "reward_model.model.path")``).
    """

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.engine: BaseEngine | None = None

    def checkpoint_role(self) -> str:
        raise NotImplementedError

    def frozen_model(self) -> tuple[str, str]:
        raise NotImplementedError

    def _start_engine(self, mesh: str) -> None:
        """Join the process group, build the engine and declare its place on ``mesh``."""
        from rlcore.roles.mesh import declare_mesh

        self.init_process_group(self.spec.backend)
        self.engine = self.spec.engine.engine.build(self.spec.engine.spec)
        declare_mesh(self, self.engine, mesh)

    def _engine(self) -> BaseEngine:
        if self.engine is None:
            msg = f"{type(self).__name__} {self.checkpoint_role()}: call init_model() first"
            raise RuntimeError(msg)
        return self.engine

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
