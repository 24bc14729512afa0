"""This process's device and dtype: the device, the default process group, seed and threads.

torch is imported by the functions (plugin discovery imports nothing heavy).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from rlcore.errors import ConfigError
from rlcore.interfaces import (
    DTYPE_NAMES,
)

if TYPE_CHECKING:
    import torch


log = logging.getLogger(__name__)

__all__ = [
    "dtype_from_name",
    "init_device",
    "local_device_index",
]


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a config ``dtype`` name (``model.dtype``, ``EngineSpec.dtype``, ...).

    The one table of the names in :data:`rlcore.interfaces.DTYPE_NAMES`: ``"float32"``,
    ``"bfloat16"``, ``"float16"``.
    """
    import torch

    if name not in DTYPE_NAMES:
        msg = f"unknown dtype {name!r}; choose from {', '.join(DTYPE_NAMES)}"
        raise ConfigError(msg)
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def process_group_backend(device: str) -> str:
    """The torch.distributed backend for ``device`` (``"cuda"`` or ``"cpu"``, as
    ``EngineSpec.device``): nccl on CUDA, gloo otherwise. The one backend rule, for the
    engines' own groups, the role workers' and the weight bridge."""
    return "nccl" if device == "cuda" else "gloo"


def local_device_index(local_rank: int, device_count: int) -> int:
    """The CUDA device of this process, as the worker base picks it.

    Ray narrows ``CUDA_VISIBLE_DEVICES`` to the actor's own GPU, so a worker with
    ``LOCAL_RANK=1`` sees one device, index 0; a launcher that shows every GPU to every
    process (torchrun) gets ``LOCAL_RANK``.
    """
    return local_rank % max(1, device_count)


def init_device(
    device: str, *, seed: int | None = None, num_threads: int | None = None
) -> torch.device:
    """This process's device; joins (or creates) the default process group; seeds; threads.

    ``device`` is ``EngineSpec.device``: ``"cuda"`` selects this process's GPU
    (:func:`local_device_index`), ``"cpu"`` the CPU. A worker has initialised the group already
    (env ``MASTER_ADDR``/``RANK``/``WORLD_SIZE``); otherwise a launcher's env is used when
    present, else a private 1-rank group (an engine built in a test or a notebook).
    ``seed``: ``torch.manual_seed`` (all devices) when given, e.g. so that a freshly initialised
    value head is the same on every rank. ``num_threads``: torch's intra-op threads when given
    (a worker has pinned them to its CPU share already; None leaves them as they are).
    """
    import torch
    import torch.distributed as dist

    if device == "cuda":
        if not torch.cuda.is_available():
            msg = "device = 'cuda' but torch sees no CUDA device; use device = 'cpu'"
            raise ConfigError(msg)
        torch.cuda.set_device(
            local_device_index(int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count())
        )
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        backend = process_group_backend(dev.type)
        if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, device_id=dev if dev.type == "cuda" else None)
        else:
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
        log.info("initialised a %s process group of %d rank(s)", backend, dist.get_world_size())
    if seed is not None:
        torch.manual_seed(seed)
    if num_threads is not None and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
    return dev
