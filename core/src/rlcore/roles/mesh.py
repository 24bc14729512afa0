"""Each engine's data-parallel place, declared per mesh on the worker that holds it.

Every engine declares its place in a mesh of its own (``actor``, ``ref``, ``critic``,
``rollout``; :meth:`BaseEngine.dispatch_info`, default: purely data-parallel), and the methods
that feed it rows use that mesh's dispatch (:func:`rlcore.dispatch.mesh_dispatch_mode`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcore.dispatch import DispatchInfo

if TYPE_CHECKING:
    from rlcore.interfaces import BaseEngine, BaseRollout
    from rlcore.workers import Worker

__all__ = ["ACTOR_MESH", "CRITIC_MESH", "REF_MESH", "ROLLOUT_MESH", "declare_mesh"]

# One mesh per engine: a tensor-parallel actor may sit next to a data-parallel reference.
ACTOR_MESH = "actor"
REF_MESH = "ref"
CRITIC_MESH = "critic"
# generate_sequences is dispatched by this mesh: one prompt shard per rollout engine, which may
# span several workers (vLLM tensor parallelism, rlcore_vllm/parallel.py).
ROLLOUT_MESH = "rollout"


def declare_mesh(worker: Worker, engine: BaseEngine | BaseRollout, mesh: str) -> DispatchInfo:
    """Register ``engine``'s (or a rollout's) data-parallel place as ``mesh`` on ``worker``.

    One without a mesh of its own (``dispatch_info()`` is None) is purely data-parallel:
    every rank is its own data-parallel group. Returns the place registered.
    """
    info = engine.dispatch_info() or DispatchInfo(
        dp_rank=worker.rank, dp_size=worker.world_size, is_collect=True
    )
    worker.set_dispatch_info(
        dp_rank=info.dp_rank, dp_size=info.dp_size, is_collect=info.is_collect, mesh=mesh
    )
    return info
