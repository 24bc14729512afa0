"""Weights from the trainer's pool to the rollout's: one collective group spanning both pools.

When the rollout has a pool of its own (``[resources] placement = { rollout = "gen" }``), its
processes are not in the trainer's ``torch.distributed`` world. A :class:`WeightBridge` is a
second process group, independent of each side's default one: bridge rank 0 is the trainer's
rank 0 (which holds the full, gathered tensors), ranks ``1..R`` are the rollout's ranks. It is
built straight from a store (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU), so
neither side's default group has to contain the other.

One sync is a header broadcast (``[version, tensors, elements]``, int64), then the weights in
buckets: consecutive tensors of one dtype flattened into one buffer of at most
``bucket_bytes`` (a tensor larger than that travels alone). Both sides know the layout from a
manifest (name, shape, dtype of every tensor, in the order the trainer streams them) agreed
when the bridge opens, so no per-tensor metadata crosses per step. A receiver checks the
header against the manifest and the version it expects, and hands the rollout views into the
bucket one at a time (valid until the next is requested, as ``BaseRollout.update_weights``
allows).

Every wait is bounded by ``timeout_s`` (``resources.collective_timeout_s``): the rendezvous,
and each broadcast (gloo honours the group timeout; the wait is bounded as well). A peer that
never joins or stops half way raises :class:`WeightSyncError` naming the two pools.
The store listens on the trainer rank-0 node's address only (127.0.0.1 for a local run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs

from rlcore.errors import RlcoreError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = [
    "TIMEOUT_KEY",
    "TensorMeta",
    "WeightBridge",
    "WeightSyncError",
    "manifest_of",
    "plan_buckets",
]

TIMEOUT_KEY = "resources.collective_timeout_s"


class WeightSyncError(RlcoreError):
    """Weights could not cross from the trainer's pool to the rollout's."""


@attrs.frozen
class TensorMeta:
    """One streamed tensor: HF name, shape and dtype name (``"float32"``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def manifest_of(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    """The manifest of a stream (consumes it: every trainer rank must iterate, collective)."""
    return [TensorMeta(n, tuple(int(d) for d in t.shape), _dtype_name(t)) for n, t in named]


def plan_buckets(manifest: Sequence[TensorMeta], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``manifest`` per bucket: consecutive, one dtype, at most ``bucket_bytes``."""
    import torch

    buckets: list[list[int]] = []
    size = 0
    dtype = None
    for i, meta in enumerate(manifest):
        nbytes = meta.numel * torch.empty((), dtype=getattr(torch, meta.dtype)).element_size()
        if not buckets or meta.dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, meta.dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


class WeightBridge:
    """A process group of trainer rank 0 (bridge rank 0) and the rollout ranks (1..R)."""

    def __init__(
        self,
        *,
        addr: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        pools: str,
        manifest: Sequence[TensorMeta],
        bucket_bytes: int,
    ) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import PrefixStore

        from rlcore.workers.bound_store import rendezvous_store

        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout_s, self.pools = float(timeout_s), pools
        self.manifest = list(manifest)
        self.buckets = plan_buckets(self.manifest, bucket_bytes)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        timeout = timedelta(seconds=self.timeout_s)
        try:
            store = PrefixStore(
                "rlcore_weight_bridge",
                rendezvous_store(
                    addr, port, rank=rank, world_size=world_size, timeout_s=self.timeout_s
                ),
            )
            if backend == "nccl":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self.pg: Any = dist.ProcessGroupNCCL(store, rank, world_size, options)
            else:
                self.pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        except (RuntimeError, OSError) as err:
            raise self._error("opening the group", err) from err
        self.syncs = 0
        self.bytes_per_sync = sum(
            m.numel * torch.empty((), dtype=getattr(torch, m.dtype)).element_size()
            for m in self.manifest
        )

    # --- one broadcast, bounded -----------------------------------------------------------

    def _error(self, what: str, err: BaseException) -> WeightSyncError:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        msg = (
            f"weight sync between pools {self.pools}: {what} did not complete within "
            f"{self.timeout_s:g} s ({TIMEOUT_KEY}), bridge rank {self.rank} of "
            f"{self.world_size}: {first}"
        )
        return WeightSyncError(msg)

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        try:
            work = self.pg.broadcast([tensor], opts)
            work.wait(timedelta(seconds=self.timeout_s))
        except RuntimeError as err:
            raise self._error(what, err) from err

    # --- the two sides --------------------------------------------------------------------

    def _header(self, version: int) -> torch.Tensor:
        import torch

        total = sum(m.numel for m in self.manifest)
        return torch.tensor([version, len(self.manifest), total], dtype=torch.int64)

    def _bucket_buffers(self, version: int) -> Iterator[tuple[str, list[TensorMeta], torch.Tensor]]:
        """Per bucket of the manifest: its name in errors, its tensors' metas, and an empty
        flat buffer of their dtype and total size (filled by the sender, received into)."""
        import torch

        for b, indices in enumerate(self.buckets):
            metas = [self.manifest[i] for i in indices]
            flat = torch.empty(
                sum(m.numel for m in metas),
                dtype=getattr(torch, metas[0].dtype),
                device=self.device,
            )
            yield f"weight version {version} bucket {b + 1}/{len(self.buckets)}", metas, flat

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Bridge rank 0: stream ``named`` (the manifest's tensors, in order) as ``version``."""

        start = time.perf_counter()
        header = self._header(version).to(self.device)
        self._broadcast(header, f"weight version {version} (header)")
        stream = iter(named)
        for what, metas, flat in self._bucket_buffers(version):
            offset = 0
            for meta in metas:
                name, tensor = next(stream)
                if name != meta.name or tuple(tensor.shape) != meta.shape:
                    msg = (
                        f"weight sync between pools {self.pools}: the trainer streamed {name!r} "
                        f"{tuple(tensor.shape)} where the manifest has {meta.name!r} "
                        f"{meta.shape}; the engine's named_parameters_for_sync changed"
                    )
                    raise WeightSyncError(msg)
                flat[offset : offset + meta.numel].copy_(tensor.reshape(-1))
                offset += meta.numel
            self._broadcast(flat, what)
        for _ in stream:  # let the engine finish its (collective) iteration
            pass
        self.syncs += 1
        return {
            "weight_sync/bytes": float(self.bytes_per_sync),
            "weight_sync/buckets": float(len(self.buckets)),
            "timing_s/worker/weight_send": time.perf_counter() - start,
        }

    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Bridge ranks 1..R: the tensors of ``version``, one view at a time (a generator)."""
        import torch

        header = torch.zeros(3, dtype=torch.int64, device=self.device)
        self._broadcast(header, f"weight version {version} (header)")
        got = [int(x) for x in header.tolist()]
        want = [int(x) for x in self._header(version).tolist()]
        if got != want:
            msg = (
                f"weight sync between pools {self.pools}: the trainer sent [version, tensors, "
                f"elements] = {got}, the rollout expected {want}"
            )
            raise WeightSyncError(msg)
        for what, metas, flat in self._bucket_buffers(version):
            self._broadcast(flat, what)
            offset = 0
            for meta in metas:
                yield meta.name, flat[offset : offset + meta.numel].view(meta.shape)
                offset += meta.numel
        self.syncs += 1
