"""Weight sync into a running vLLM engine, with bounded memory and without pickling tensors.

vLLM's ``model_runner.reload_weights(weights_iterator=...)`` reloads checkpoint-format (HF
name) tensors in place and re-runs the per-layer post-processing (on CPU, oneDNN repacks the
linear weights; a plain ``load_weights`` after start would leave them stale). It accepts a
subset of the weights per call, but a layer must arrive whole within one call: a fused module
(``qkv_proj`` = q, k, v) finished with only part of its tensors keeps stale values.

Transports, chosen by how the engine runs (and ``[rollout] weight_sync``):

- in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker): one ``collective_rpc`` call
  consumes the engine's stream lazily, so memory is bounded by what the training engine
  materialises at a time;
- multiprocess (EngineCore and workers in subprocesses): tensors in ``collective_rpc``
  arguments would be serialized as nested lists, so each bucket (whole layers, about
  ``bucket_bytes``) is written to a safetensors file in shared memory (``/dev/shm``) and the
  workers read it through :class:`WeightSyncExtension`, which vLLM mixes into its worker class;
- multiprocess on a CUDA device: by CUDA IPC handle, through vLLM's ``ipc`` weight-transfer
  backend (:mod:`rlcore_vllm.cuda_ipc`).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = [
    "WeightSyncExtension",
    "bucket_directory",
    "layer_buckets",
    "layer_key",
    "quiet_expected_vllm_warnings",
    "save_bucket",
    "tensor_bytes",
]

log = logging.getLogger(__name__)


def tensor_bytes(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Bytes of the tensors' data (what a sync moves)."""
    return sum(t.numel() * t.element_size() for _, t in named_tensors)


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def layer_key(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``model.layers.3``; other names as is."""
    m = _LAYER.match(name)
    return m.group(1) if m else name


def layer_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream into buckets of about ``bucket_bytes``, cut only between layers.

    A bucket is closed when it holds at least ``bucket_bytes`` and the next tensor starts a
    new layer, so peak memory is about ``bucket_bytes`` plus one layer.
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size, current = 0, None
    for name, tensor in named_tensors:
        key = layer_key(name)
        if bucket and size >= bucket_bytes and key != current:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        current = key
    if bucket:
        yield bucket


def bucket_directory(nbytes: int, shm: str = "/dev/shm") -> str | None:
    """Where a bucket of ``nbytes`` is written: ``shm`` when it has room for it twice over,
    else None (the temporary-files directory, on disk).

    Docker's default ``/dev/shm`` is 64 MiB: a bucket written there past its size fails with
    ENOSPC, or the reader gets SIGBUS on a file whose pages could not be backed.
    """
    import shutil

    if not os.path.isdir(shm):
        return None
    if shutil.disk_usage(shm).free < 2 * nbytes:
        log.info("weight sync: %s has under 2 x %d bytes free; bucket goes to disk", shm, nbytes)
        return None
    return shm


def save_bucket(bucket: list[tuple[str, torch.Tensor]], directory: str | None = None) -> str:
    """Write a bucket as a safetensors file (in ``/dev/shm`` where it exists); return its path."""
    from safetensors.torch import save_file

    if directory is None:
        directory = bucket_directory(tensor_bytes(bucket))
    fd, path = tempfile.mkstemp(prefix="rlcore-vllm-", suffix=".safetensors", dir=directory)
    os.close(fd)
    # contiguous CPU copies: safetensors writes raw storage (and refuses shared storage).
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in bucket}
    save_file(tensors, path)
    return path


class WeightSyncExtension:
    """Methods vLLM adds to each of its workers (``worker_extension_cls``).

    Called by name through ``LLM.collective_rpc``, so only a file path crosses processes.
    """

    def rlcore_reload_from_file(self, path: str) -> int:
        """Reload the tensors stored in the safetensors file ``path``; return how many."""
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as f:
            names = list(f.keys())

            def stream() -> Iterator[tuple[str, torch.Tensor]]:
                for name in names:
                    yield name, f.get_tensor(name)

            worker: Any = self
            _BUCKET_RELOAD.active = True  # the layers of other buckets are "not loaded" here
            try:
                worker.reload_weights(weights_iterator=stream())
            finally:
                _BUCKET_RELOAD.active = False
        return len(names)

    def rlcore_update_weights_ipc(self, update_info: dict[str, Any], handles: bytes) -> None:
        """One chunk of a CUDA IPC sync (:mod:`rlcore_vllm.cuda_ipc`) into vLLM's own
        ``Worker.update_weights`` (vLLM 0.32: ``v1/worker/gpu_worker.py:1550``).

        ``handles``: the pickled ``{GPU UUID: rebuild_cuda_tensor args}`` of the staging
        buffer. It crosses as bytes because vLLM's msgpack channel refuses its ``torch.dtype``
        and classes unless ``VLLM_ALLOW_INSECURE_SERIALIZATION`` opens every message to pickle
        (``v1/serial_utils.py:220-225``); the sender is the rollout that started this engine.
        """
        worker: Any = self
        worker.update_weights({**update_info, "ipc_handles": pickle.loads(handles)})


# Set while one bucket of a multiprocess sync reloads (in the vLLM worker's thread).
_BUCKET_RELOAD = threading.local()


def _in_bucket_reload() -> bool:
    return getattr(_BUCKET_RELOAD, "active", False)


class _DropMessages(logging.Filter):
    """Drops records containing one of ``fragments`` (only while ``when()``, if given)."""

    def __init__(self, *fragments: str, when: Any = None) -> None:
        super().__init__()
        self.fragments = fragments
        self.when = when

    def filter(self, record: logging.LogRecord) -> bool:
        if self.when is not None and not self.when():
            return True
        text = record.getMessage()
        return not any(f in text for f in self.fragments)


def quiet_expected_vllm_warnings() -> None:
    """Drop warnings that are expected here and would repeat in every run's log.

    - the chat-template warmup at start fails by design: prompts arrive as token ids and the
      engine runs without a tokenizer (``skip_tokenizer_init``);
    - every weight sync reports the rotary embedding's cache as "not loaded": it is derived
      from the config, not a weight, and vLLM keeps it;
    - in a multiprocess sync each bucket is one ``reload_weights`` call holding some layers,
      and vLLM reports every other layer as "Failed to load weights" (it keeps their current
      values, which earlier buckets of the same sync loaded) and lists every other weight as
      "not loaded from checkpoint": dozens of lines per sync and rank on SmolLM2-135M. Dropped
      only while a bucket reloads; whether the engine holds the trainer's weights is what
      ``rollout/logprob_diff_mean`` measures every step.

    Called when this module is imported: in the rollout's process and, through
    ``worker_extension_cls``, in every vLLM worker process.
    """
    filters = {
        "vllm.renderers.base": [_DropMessages("Chat template warmup failed")],
        "vllm.model_executor.model_loader.reload.layerwise": [
            _DropMessages("RotaryEmbedding: Failed to load weights"),
            _DropMessages("Failed to load weights", when=_in_bucket_reload),
        ],
        "vllm.model_executor.model_loader.reload.inplace": [
            _DropMessages("weights were not loaded from checkpoint", when=_in_bucket_reload)
        ],
    }
    for name, new in filters.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            for one in new:
                logger.addFilter(one)


quiet_expected_vllm_warnings()
