"""Process groups and gradient reductions of the megatron engine (TP x PP x DP).

``init_parallel`` joins (or creates) the default process group and initialises megatron's
``parallel_state`` once per process: the actor and reference engines of one worker share it,
so they must use the same layout. Gradient reductions are written out here (rather than
megatron's ``DistributedDataParallel``) because they are few, the same on CPU and GPU, and
keep the loss normalisation of :class:`rlcore.interfaces.BatchTotals` explicit: the loss of
each micro-batch is already divided by the mini-batch totals, so data-parallel gradients are
*summed*.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import attrs
import torch
import torch.distributed as dist

from rlcore.engine import init_device
from rlcore.errors import ConfigError

__all__ = ["Layout", "clip_grad_norm", "init_parallel", "reduce_gradients"]

log = logging.getLogger(__name__)


@attrs.frozen
class Layout:
    """This rank's place: sizes and ranks of the tensor, pipeline and data-parallel groups."""

    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def is_collect(self) -> bool:
        """The rank whose outputs stand for its data-parallel group (tp 0, last stage)."""
        return self.tp_rank == 0 and self.pp_rank == self.pp - 1


def init_parallel(
    device: str, *, tp: int, pp: int, where: str, timeout_minutes: int = 10
) -> tuple[torch.device, Layout]:
    """The engine's device and layout; initialises torch.distributed
    (:func:`rlcore.engine.init_device`) and megatron's parallel_state."""
    from megatron.core import parallel_state as ps

    dev = init_device(device)
    world = dist.get_world_size()
    if world % (tp * pp):
        msg = (
            f"{where}: tensor_parallel * pipeline_parallel = {tp} * {pp} = {tp * pp} must "
            f"divide the number of processes ({world})"
        )
        raise ConfigError(msg)
    if ps.model_parallel_is_initialized() and _outlived_its_process_group(ps):
        # Built on a default group destroyed since (a one-process check that made and tore down
        # its own): its groups are dead handles, and megatron's DDP would use them.
        ps.destroy_model_parallel()
    if ps.model_parallel_is_initialized():
        have = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
        )
        if have != (tp, pp):
            msg = (
                f"{where}: tensor_parallel={tp}, pipeline_parallel={pp} differ from the layout "
                f"another megatron engine in this process uses (tp={have[0]}, pp={have[1]}); "
                "engines sharing a worker must share the layout"
            )
            raise ConfigError(msg)
    else:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            distributed_timeout_minutes=timeout_minutes,
            create_gloo_process_groups=False,
        )
        log.info("megatron parallel_state: tp=%d pp=%d dp=%d", tp, pp, world // (tp * pp))
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=world // (tp * pp),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
    )
    return dev, layout


def _outlived_its_process_group(ps: Any) -> bool:
    """Whether megatron's groups belong to no live process group (torch forgets the ranks of
    every group when the default group is destroyed)."""
    try:
        dist.get_process_group_ranks(ps.get_model_parallel_group())
    except (KeyError, ValueError, RuntimeError):
        return True
    return False


# Bytes of gradients flattened per all-reduce: one collective for a small model (gloo pays per
# call), a bounded extra buffer for a large one (one buffer of every gradient doubled the
# gradient memory: out of memory at 7B).
REDUCE_BUCKET_BYTES = 256 << 20


def _all_reduce_coalesced(
    grads: list[torch.Tensor],
    group: dist.ProcessGroup,
    bucket_bytes: int = REDUCE_BUCKET_BYTES,
) -> None:
    """Sum ``grads`` over ``group``, one collective per dtype and bucket of ``bucket_bytes``
    (a gradient larger than a bucket goes alone, reduced in place)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for g in same:
            nbytes = g.numel() * g.element_size()
            if bucket and size + nbytes > bucket_bytes:
                _reduce_bucket(bucket, group)
                bucket, size = [], 0
            bucket.append(g)
            size += nbytes
        if bucket:
            _reduce_bucket(bucket, group)


def _reduce_bucket(bucket: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    if len(bucket) == 1 and bucket[0].is_contiguous():
        dist.all_reduce(bucket[0], group=group)
        return
    flat = torch.cat([g.reshape(-1) for g in bucket])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in bucket:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def reduce_gradients(model: torch.nn.Module, layout: Layout, *, tied_output: bool) -> None:
    """Sum gradients over data-parallel replicas; sync what TP/PP replicate.

    - data parallel: every gradient, summed (the losses are normalised globally);
    - sequence parallel: norms see only their sequence shard, so their gradients are summed
      over the tensor-parallel group (megatron marks them ``sequence_parallel``);
    - tied embeddings across pipeline stages: the first stage's embedding and the last stage's
      output copy receive each other's gradient (megatron's embedding group).
    """
    from megatron.core import parallel_state as ps

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if layout.dp > 1:
        _all_reduce_coalesced(
            [p.grad for p in params if p.grad is not None], ps.get_data_parallel_group()
        )
    if layout.tp > 1:
        seq = [
            p.grad for p in params if getattr(p, "sequence_parallel", False) and p.grad is not None
        ]
        if seq:
            _all_reduce_coalesced(seq, ps.get_tensor_model_parallel_group())
    if tied_output and layout.pp > 1 and ps.is_rank_in_embedding_group():
        weight = model.shared_embedding_or_output_weight()  # type: ignore[operator]
        if weight is not None and weight.grad is not None:
            dist.all_reduce(weight.grad, group=ps.get_embedding_group())


def _counted(
    model: torch.nn.Module, layout: Layout, *, tied_output: bool
) -> Iterable[torch.Tensor]:
    """Gradients that count once toward the global norm (no TP duplicate, no tied copy)."""
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if layout.tp_rank > 0 and not getattr(p, "tensor_model_parallel", False):
            continue  # replicated over TP: rank 0 counts it
        if tied_output and layout.pp > 1 and layout.pp_rank > 0 and name == "output_layer.weight":
            continue  # the last stage's copy of the first stage's embedding
        yield p.grad


def clip_grad_norm(
    model: torch.nn.Module, layout: Layout, max_norm: float, *, tied_output: bool
) -> float:
    """Global L2 norm of the gradients over TP x PP; scale them to ``max_norm`` (torch's rule).

    Data-parallel replicas hold identical (already summed) gradients, so the norm is reduced
    over the model-parallel group only. Non-finite norms are returned without scaling.
    """
    from megatron.core import parallel_state as ps

    grads = list(_counted(model, layout, tied_output=tied_output))
    device = next(model.parameters()).device
    square = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        square += g.detach().double().pow(2).sum()
    if layout.tp * layout.pp > 1:
        dist.all_reduce(square, group=ps.get_model_parallel_group())
    norm = float(square.sqrt())
    if math.isfinite(norm) and max_norm < math.inf:
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm


def stage_of(name: str, layers: int, pp: int) -> int:
    """The pipeline stage holding megatron parameter ``name``: the embedding on the first, the
    final norm and output layer on the last, decoder layer i on stage i // (layers / pp)."""
    if name.startswith("decoder.layers."):
        return int(name.split(".")[2]) // (layers // pp)
    return 0 if name.startswith("embedding.") else pp - 1


def broadcast_from_stage(
    parts: list[torch.Tensor],
    owner: int,
    pp_rank: int,
    group: dist.ProcessGroup,
    dtype: torch.dtype,
    device: torch.device,
) -> list[torch.Tensor]:
    """The owner stage's ``parts`` (its tensor-parallel shards of one parameter) on every stage
    of the pipeline ``group``: a shape header, then the stacked shards."""
    src = dist.get_global_rank(group, owner)
    header = torch.zeros(8, dtype=torch.int64, device=device)
    if pp_rank == owner:
        shape = (len(parts), *parts[0].shape)
        header[0] = len(shape)
        header[1 : 1 + len(shape)] = torch.tensor(shape)
    dist.broadcast(header, src=src, group=group)
    shape = tuple(int(x) for x in header[1 : 1 + int(header[0])])
    if pp_rank == owner:
        stacked = torch.stack(parts).to(dtype)
    else:
        stacked = torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(stacked, src=src, group=group)
    return list(stacked.unbind(0))
