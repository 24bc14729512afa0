"""The critic role worker (PPO's value model): ``compute_values`` and ``update_critic``.

It gets its :class:`~rlcore.roles.specs.CriticSpec` from the driver, builds its engine and the
algorithm (for the value loss) from their components, and declares its engine's place in the
``critic`` mesh (:mod:`rlcore.roles.mesh`). Undecorated: the worker group applies
``ray.remote``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.roles.mesh import CRITIC_MESH, declare_mesh
from rlcore.roles.update import RoleTrainer, clock, summed
from rlcore.tracking.metrics import peak_rss_gb
from rlcore.workers import RoleWorker

if TYPE_CHECKING:
    from rlcore.interfaces import BaseAlgorithm, BaseEngine
    from rlcore.protocol import DataProto
    from rlcore.roles.specs import CriticSpec

log = logging.getLogger(__name__)

__all__ = ["CriticWorker"]

# Same name as rlcore.checkpoint.CRITIC_DIR (the checkpoint layout contract).
CRITIC_SUBDIR = "critic"
_CRITIC = mesh_dispatch_mode(CRITIC_MESH)


class CriticWorker(RoleWorker):
    """The value model (PPO): ``compute_values`` and ``update_critic``."""

    spec: CriticSpec

    def __init__(self, spec: CriticSpec) -> None:
        super().__init__(spec)
        self.critic: BaseEngine | None = None
        self.algorithm: BaseAlgorithm | None = None
        self._trainer: RoleTrainer | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        spec = self.spec
        self.init_process_group(spec.backend)
        self.algorithm = spec.algorithm.build()
        self.critic = spec.critic.engine.build(spec.critic.spec)
        mesh = declare_mesh(self, self.critic, CRITIC_MESH)
        self._trainer = RoleTrainer(
            "critic", self.critic, spec.update, replicas=self.world_size // mesh.dp_size
        )
        log.info("rank %d: critic ready", self.rank)

    def _parts(self) -> tuple[BaseEngine, BaseAlgorithm, RoleTrainer]:
        if self.critic is None or self.algorithm is None or self._trainer is None:
            msg = "CriticWorker: call init_model() first"
            raise RuntimeError(msg)
        return self.critic, self.algorithm, self._trainer

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Critic engine state and this rank's state map into ``path/critic`` (every rank)."""
        from rlcore.checkpoint import save_worker_state

        critic, _, trainer = self._parts()
        out = Path(path) / CRITIC_SUBDIR
        critic.save_checkpoint(str(out))
        save_worker_state(out, self.rank, {"critic_optimizer_steps": trainer.steps})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        from rlcore.checkpoint import load_worker_state

        critic, _, trainer = self._parts()
        src = Path(path) / CRITIC_SUBDIR
        critic.load_checkpoint(str(src))
        trainer.steps = int(load_worker_state(src, self.rank)["critic_optimizer_steps"])

    @register(dispatch_mode=_CRITIC)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): the critic's estimate before each response token."""
        from rlcore.protocol import DataProto

        critic, _, _ = self._parts()
        timing: dict[str, list[float]] = {}
        with clock(timing, "critic_forward"):
            values = critic.compute_values(data)
        return DataProto.from_dict(
            tensors={"values": values}, meta_info={"metrics": summed(timing)}
        )

    @register(dispatch_mode=_CRITIC)
    def update_critic(self, data: DataProto, step: int) -> DataProto:
        """``epochs`` passes of the algorithm's value loss over mini-batches; metrics only."""
        from rlcore.protocol import DataProto

        _, algorithm, trainer = self._parts()
        metrics: dict[str, list[float]] = {}
        timing: dict[str, list[float]] = {}
        trainer.run(
            algorithm.value_loss,
            data,
            step=step,
            temperature=1.0,  # values have no temperature
            with_entropy=False,
            metrics=metrics,
            timing=timing,
        )
        metrics["perf/peak_rss_gb/critic"] = [peak_rss_gb()]
        return DataProto(meta_info={"metrics": {**metrics, **summed(timing)}})
