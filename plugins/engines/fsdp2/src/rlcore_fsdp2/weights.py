"""Full tensors out of the sharded model, a bucket at a time (weight sync, export, LoRA).

FSDP2 leaves every parameter a DTensor sharded on dim 0 over the mesh. :func:`gathered`
streams full tensors with one all-gather per bucket of about :data:`SYNC_BUCKET_BYTES`
(:func:`gather_bucket`) instead of one per tensor: dozens of small gloo collectives cost more
than the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

__all__ = ["SYNC_BUCKET_BYTES", "gather_bucket", "gathered", "whole_local_tensors"]

# Full-size bytes gathered per weight-sync collective: a few decoder layers of a small model,
# a fraction of one of a 7B model (peak extra memory is about 3x this, on the engine's device).
SYNC_BUCKET_BYTES = 128 << 20

# torch 2.13 renamed all_gather_into_tensor to all_gather_single and warns at every call of the
# old name (each weight sync); older torch (the 2.6 floor) has only the old name.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gathered(
    model: torch.nn.Module,
    keep: Callable[[str], bool],
    dtype: torch.dtype | None,
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full tensors of the state-dict entries whose name ``keep`` accepts, by bucket.

    Collective: every rank iterates. Tied names come under both names, gathered once.
    """
    # keep_vars: tied names map to the same Parameter object, so it is gathered once.
    entries: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if keep(name):
            entries.setdefault(id(tensor), ([], tensor))[0].append(name)
    bucket: list[tuple[list[str], torch.Tensor]] = []
    size = 0
    for names, tensor in entries.values():
        bucket.append((names, tensor))
        # Global sizes only: every rank cuts the same buckets and issues the same gathers.
        size += tensor.numel() * (dtype or tensor.dtype).itemsize
        if size >= SYNC_BUCKET_BYTES:
            yield from gather_bucket(bucket, dtype, device)
            bucket, size = [], 0
    if bucket:
        yield from gather_bucket(bucket, dtype, device)


def whole_local_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """Every state-dict entry as this rank's local tensor, when each is whole here; else None.

    One rank (or HSDP shard groups of one rank): FSDP2's local shard of each parameter is the
    full tensor, and the very storage the optimizer updates in place, so a rollout in this
    process can read it instead of a copy (the colocated weight sync, 0 bytes). Tied names map
    to the same tensor. None as soon as one parameter is split across ranks.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if local.shape != tensor.shape:
            return None
        out[name] = local.detach()  # same storage, outside autograd
    return out


def _fsdp_shard_dim(tensor: DTensor) -> int | None:
    """The mesh dim of FSDP's ``Shard(0)`` when every other placement is ``Replicate``.

    -1: fully replicated (the local tensor is the full tensor). None: another layout (TP,
    strided or partial shards), which :func:`gather_bucket` leaves to ``full_tensor()``.
    """
    shard_dim = -1
    for mesh_dim, placement in enumerate(tensor.placements):
        if type(placement) is Shard and placement.dim == 0 and shard_dim == -1:
            shard_dim = mesh_dim
        elif not isinstance(placement, Replicate):
            return None
    return shard_dim


def gather_bucket(
    bucket: list[tuple[list[str], torch.Tensor]], dtype: torch.dtype | None, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for a bucket with one all-gather per (shard group, dtype).

    DTensor ``Shard(0)`` splits like ``torch.chunk``: rank k holds rows [k*c, min((k+1)*c, n))
    with c = ceil(n / ws), possibly none. Each rank packs its shards, each padded to c rows,
    into one flat buffer (cast to ``dtype`` first: the cast is elementwise, so exact, and it
    halves the bytes for fp32 masters synced as bf16); the gathered (ws, numel) buffer holds
    rank k's padded chunk of every tensor at the same offset, so a tensor's (ws*c, ...) rows
    are a strided slice, and its first n rows are the full tensor.
    """
    # (group, dtype) -> [(bucket index, padded local numel per rank)]
    packs: dict[tuple[Any, torch.dtype], list[tuple[int, int]]] = {}
    full: dict[int, torch.Tensor] = {}
    for i, (_, tensor) in enumerate(bucket):
        target = dtype or tensor.dtype
        if not isinstance(tensor, DTensor):
            full[i] = tensor.detach().to(target)
            continue
        shard_dim = _fsdp_shard_dim(tensor)
        if shard_dim is None or tensor.ndim == 0:
            full[i] = tensor.detach().to(device).full_tensor().to(target)
            continue
        if shard_dim == -1:
            full[i] = tensor.to_local().detach().to(device=device, dtype=target)
            continue
        group = tensor.device_mesh.get_group(shard_dim)
        ws = dist.get_world_size(group)
        rows = tensor.shape[0]
        padded = -(-rows // ws) * (tensor.numel() // rows if rows else 0)
        packs.setdefault((group, target), []).append((i, padded))
    for (group, target), items in packs.items():
        ws = dist.get_world_size(group)
        total = sum(padded for _, padded in items)
        flat = torch.empty(total, dtype=target, device=device)
        offset = 0
        for i, padded in items:
            local = bucket[i][1].to_local().detach().reshape(-1)
            flat[offset : offset + local.numel()].copy_(local)  # the pad tail stays unset
            offset += padded
        gathered = torch.empty(ws * total, dtype=target, device=device)
        _all_gather_flat(gathered, flat, group=group)
        per_rank = gathered.view(ws, total)
        offset = 0
        for i, padded in items:
            tensor = bucket[i][1]
            chunk = per_rank[:, offset : offset + padded]  # (ws, c * row)
            full[i] = chunk.reshape(-1, *tensor.shape[1:])[: tensor.shape[0]]
            offset += padded
    for i, (names, _) in enumerate(bucket):
        for name in names:
            yield name, full[i]
