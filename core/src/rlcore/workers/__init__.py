"""Worker processes and the driver-side groups that call them.

- :class:`Worker` (``rlcore.workers.worker``): base of every worker class; rank, world size,
  local rank, master address/port for torch.distributed, ``init_process_group``,
  ``set_dispatch_info`` for mesh-aware dispatch, torch threads pinned to the CPU share;
  :class:`WorkerSettings`, the run's settings a worker applies (``Worker.apply_settings``);
  :class:`RoleWorker`, a worker built from a role's spec (its settings applied first).
- :class:`RayWorkerGroup` (``rlcore.workers.worker_group``): places one Ray actor per
  resource-pool slot and exposes every ``@register``-ed method as a group method.
- :class:`ClassWithInitArgs`, :func:`create_colocated_worker_cls` (``rlcore.workers.colocate``):
  several roles in one process, per-role views through ``RayWorkerGroup.spawn()``.

Importing this package does not import Ray or torch.
"""

from __future__ import annotations

from rlcore.workers.colocate import ClassWithInitArgs, ColocatedWorker, create_colocated_worker_cls
from rlcore.workers.worker import RoleWorker, Worker, WorkerSettings
from rlcore.workers.worker_group import RayWorkerGroup, registered_methods

__all__ = [
    "ClassWithInitArgs",
    "ColocatedWorker",
    "RayWorkerGroup",
    "RoleWorker",
    "Worker",
    "WorkerSettings",
    "create_colocated_worker_cls",
    "registered_methods",
]
