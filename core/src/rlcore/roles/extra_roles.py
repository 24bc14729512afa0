"""The algorithm's extra roles (:attr:`BaseAlgorithm.extra_roles`): checked, specced, placed.

An algorithm declares, e.g., ``ExtraRole(name="teacher")`` (the log-probs of another model);
the user configures it in ``[roles.teacher]``::

    [roles.teacher]
    model = { path = "models/teacher" }
    engine = { name = "fsdp2" }        # optional: the actor's engine, options included

Before Ray starts, :func:`rlcore.preflight.roles.check_extra_roles` turns a role
without a section, a section no role asks for and a model folder that does not exist into one
line naming the key. :func:`rlcore.trainer.specs.build_role_specs` makes one
:class:`~rlcore.roles.specs.RoleSpec` per role on the driver;
:class:`ExtraRoleWorker` holds its engine, colocated with the built-in roles in one process
per device (:func:`rlcore.trainer.builder.build_workers`) and checkpointed with them (its own
folder ``<name>/`` of a checkpoint; a frozen model keeps only its rank's state map there).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rlcore.dispatch import Dispatch, mesh_dispatch_mode, register
from rlcore.roles.frozen_model import FrozenModelWorker

if TYPE_CHECKING:
    from rlcore.protocol import DataProto
    from rlcore.roles.specs import RoleSpec

log = logging.getLogger(__name__)

__all__ = ["EXTRA_ROLE_MESH", "ExtraRoleWorker"]

# Each extra role's worker declares its own engine's place here (one instance per role, so
# two roles never share a declaration).
EXTRA_ROLE_MESH = "extra_role"
_EXTRA = mesh_dispatch_mode(EXTRA_ROLE_MESH)


class ExtraRoleWorker(FrozenModelWorker):
    """A frozen model's engine: ``compute_log_prob`` gives ``<name>_log_prob`` (B, R)."""

    spec: RoleSpec

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self._start_engine(EXTRA_ROLE_MESH)
        log.info("rank %d: role %s ready", self.rank, self.spec.name)

    @register(dispatch_mode=_EXTRA)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``<name>_log_prob`` (B, R): the responses' log-probs under this role's model."""
        from rlcore.protocol import DataProto
        from rlcore.roles.update import clock, summed

        timing: dict[str, list[float]] = {}
        with clock(timing, f"{self.spec.name}_forward"):
            outputs = self._engine().compute_log_prob(data, temperature=self.spec.temperature)
        if outputs.log_probs is None:
            msg = f"role {self.spec.name}: the engine returned no log_probs"
            raise RuntimeError(msg)
        return DataProto.from_dict(
            tensors={self.spec.output_key: outputs.log_probs},
            meta_info={"metrics": summed(timing)},
        )

    def checkpoint_role(self) -> str:
        return self.spec.name

    def frozen_model(self) -> tuple[str, str]:
        return f"role {self.spec.name!r}", f"roles.{self.spec.name}.model.path"
