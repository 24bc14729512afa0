"""Tensor-parallel generation (``tensor_parallel_size > 1``, GPU): one TP rank per policy worker.

rlcore places one process per device and colocates the actor, the rollout and the reference
in it (ARCHITECTURE.md, "Roles and placement"), so a rollout worker sees one GPU. A TP engine
therefore spans several policy workers, as verl's hybrid engine does: every worker of a TP
group runs vLLM in-process with ``distributed_executor_backend = "external_launcher"`` in the
trainer's own ``torch.distributed`` world (TP groups are ``tensor_parallel_size`` consecutive
ranks, vLLM's layout), all ranks of a group get the same prompts and sample the same tokens,
and only the group's first rank returns them. The rollout's ``dispatch_info()``
(:func:`rollout_mesh`) says where its rank sits, the policy worker registers that place with
``set_dispatch_info(mesh="rollout")``, and ``generate_sequences`` is dispatched by that mesh
(``MESH_COMPUTE_PROTO[rollout]``): each prompt shard goes once to each TP group. Weight sync
needs nothing more: every rank streams the full tensors and vLLM's loader keeps its own shard.

The other way, vLLM's own executor spawning TP workers inside one rlcore worker, needs that
worker to see ``tensor_parallel_size`` GPUs, which one-process-per-device placement never
gives.

On CPU it is refused: the vLLM CPU build's TP engine (two workers, ``mp`` executor, gloo) did
not finish starting within 600 s on the 2-core CI machine (tiny model, measured 2026-12-01).
"""

from __future__ import annotations

from typing import Any

from rlcore.dispatch import DispatchInfo
from rlcore.errors import ConfigError

__all__ = ["check_tensor_parallel", "external_launcher_kwargs", "group_seed", "rollout_mesh"]


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def check_tensor_parallel(
    tp: int,
    *,
    on_cpu: bool,
    async_engine: bool,
    multiprocessing: bool | None = None,
    world: int | None = None,
) -> None:
    """One line naming ``[rollout] tensor_parallel_size`` when this run cannot use it.

    ``world``: the policy workers (None: this process's ``torch.distributed`` world); the
    driver's check before Ray starts passes the config's."""
    if tp == 1:
        return
    if on_cpu:
        msg = (
            f"[rollout] tensor_parallel_size = {tp} is refused on CPU: the vLLM CPU build's "
            "tensor-parallel engine did not start within 600 s on a 2-core machine; use "
            "tensor_parallel_size = 1 and more policy workers (resources.processes_per_node)"
        )
        raise ConfigError(msg)
    if async_engine:
        msg = (
            f"[rollout] async_engine = true cannot run tensor_parallel_size = {tp}: the TP "
            "ranks are policy workers that must run the same requests in the same order; "
            "set async_engine = false (the default with tensor_parallel_size > 1)"
        )
        raise ConfigError(msg)
    if multiprocessing:
        msg = (
            f"[rollout] multiprocessing = true cannot run tensor_parallel_size = {tp}: each TP "
            "rank runs vLLM in-process in its policy worker; leave multiprocessing unset"
        )
        raise ConfigError(msg)
    if world is None:
        _, world = _world()
    if world % tp:
        msg = (
            f"[rollout] tensor_parallel_size = {tp} must divide the number of policy workers "
            f"({world}: resources.nnodes x resources.processes_per_node); each TP rank is one "
            "worker"
        )
        raise ConfigError(msg)


def external_launcher_kwargs(tp: int) -> dict[str, Any]:
    """Engine arguments of one TP rank in the trainer's world of ``world`` workers.

    vLLM sizes its world as ``tp x data_parallel_size`` and, with the external launcher,
    puts rank ``r`` in data-parallel group ``r // tp`` (``ParallelConfig``), each group an
    engine of its own that steps in lockstep with the others (``LLMEngine``'s
    ``external_launcher_dp``).

    Custom all-reduce is off: each rlcore worker sees one GPU (``CUDA_VISIBLE_DEVICES`` of one
    device), and vLLM's ``CustomAllreduce`` probes peer access for ordinals ``0..tp-1`` of this
    process (``_can_p2p(rank, world_size)`` -> ``gpu_p2p_access_check``, and
    ``device_ids[device.index]`` over the visible list, in
    ``vllm/distributed/device_communicators/custom_all_reduce.py``), which do not exist here.
    verl passes the same for its workers (``"disable_custom_all_reduce": True`` in
    ``verl/workers/rollout/vllm_rollout/vllm_async_server.py``, ``launch_server``). NCCL's
    all-reduce is used instead.
    """
    _, world = _world()
    return {
        "distributed_executor_backend": "external_launcher",
        "tensor_parallel_size": tp,
        "data_parallel_size": world // tp,
        "disable_custom_all_reduce": True,
    }


def rollout_mesh(tp: int) -> DispatchInfo:
    """This rank's place in the ``rollout`` mesh (``VLLMRollout.dispatch_info``)."""
    rank, world = _world()
    return DispatchInfo(dp_rank=rank // tp, dp_size=world // tp, is_collect=rank % tp == 0)


def group_seed(seed: int, tp: int) -> int:
    """The seed of the TP group's first rank (workers offset seeds by rank): one draw per group.

    Collective over the trainer's world: every policy worker calls it while building the
    rollout.
    """
    import torch.distributed as dist

    rank, world = _world()
    seeds: list[Any] = [None] * world
    dist.all_gather_object(seeds, seed)
    return int(seeds[rank - rank % tp])
