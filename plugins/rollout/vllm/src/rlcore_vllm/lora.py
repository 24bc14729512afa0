"""Adapter-only weight sync: the trainer's LoRA adapter served through vLLM's LoRA support.

With ``[rollout] lora_sync = "adapter"`` the engine starts with ``enable_lora`` and a LoRA
actor sends only its adapter per sync (``lora_A``/``lora_B`` of each target module and the
peft config: rank, alpha, targets), not the merged full weights. vLLM loads adapters from a
folder (``LoRARequest.lora_path``: ``adapter_config.json`` + ``adapter_model.safetensors``,
read by ``vllm.lora.worker_manager``), so each sync writes one into a private temporary
folder (``mkdtemp``: mode 0700; in ``/dev/shm`` where it has room) and registers it under a
new adapter id and name: vLLM caches adapters by id, and a reused id would keep serving the
previous weights. The previous adapter is removed from the engine and its folder deleted once
the new one is loaded; the last folder goes at :meth:`AdapterSlot.close` (or at exit).

Only a path crosses into the engine's processes, as with the weight buckets
(:mod:`rlcore_vllm.weights`); nothing is pickled.
"""

from __future__ import annotations

import enum
import json
import shutil
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rlcore.errors import ConfigError
from rlcore_vllm.weights import bucket_directory, tensor_bytes

__all__ = ["MAX_LORA_RANKS", "AdapterSlot"]

# vLLM's LoRAConfig.max_lora_rank accepts these values only (vllm/config/lora.py).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _jsonable(value: Any) -> Any:
    """peft's config dict holds sets (``target_modules``) and enums (``task_type``)."""
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, enum.Enum):
        return value.value
    msg = f"adapter config value {value!r} ({type(value).__name__}) is not JSON"
    raise TypeError(msg)


class AdapterSlot:
    """The adapter a vLLM engine serves now: its ``LoRARequest`` and folder, replaced per sync.

    ``engine``: an object with vLLM's ``add_lora(request)`` / ``remove_lora(id)`` (the
    ``LLMEngine`` of ``vllm.LLM``, or :class:`~rlcore_vllm.async_engine.AsyncEngine`).
    """

    def __init__(self, max_rank: int, dtype: torch.dtype) -> None:
        self.max_rank = max_rank
        self.dtype = dtype
        self.version = 0  # the adapter id of the last sync (vLLM ids start at 1)
        self.request: Any = None  # the LoRARequest generation passes; None before a sync
        self._folders: list[str] = []  # on disk now: the current adapter's (and a new one's)
        self._cleanup = weakref.finalize(self, _remove_folders, self._folders)

    def load(
        self,
        engine: Any,
        adapter_config: dict[str, Any],
        named_tensors: Iterable[tuple[str, torch.Tensor]],
    ) -> int:
        """Write the adapter, register it under a new id, drop the previous one; its bytes."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        rank = int(adapter_config.get("r", 0))
        if rank > self.max_rank:
            allowed = [r for r in MAX_LORA_RANKS if r >= rank]
            msg = (
                f"[rollout] max_lora_rank = {self.max_rank} is below the actor's LoRA rank "
                f"{rank} ([actor.engine] lora_rank); set [rollout] max_lora_rank = "
                f"{allowed[0] if allowed else max(MAX_LORA_RANKS)}"
            )
            raise ConfigError(msg)
        tensors = {name: t.detach().to("cpu", self.dtype).contiguous() for name, t in named_tensors}
        nbytes = tensor_bytes(tensors.items())
        folder = tempfile.mkdtemp(prefix="rlcore-lora-", dir=bucket_directory(nbytes))
        self._folders.append(folder)
        save_file(tensors, str(Path(folder) / "adapter_model.safetensors"))
        text = json.dumps(adapter_config, default=_jsonable)
        (Path(folder) / "adapter_config.json").write_text(text, encoding="utf-8")
        self.version += 1
        request = LoRARequest(
            lora_name=f"rlcore-sync-{self.version}", lora_int_id=self.version, lora_path=folder
        )
        engine.add_lora(request)  # loads it now: a bad adapter fails the sync, not a generate
        previous, self.request = self.request, request
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)
        _remove_folders(self._folders[:-1])
        del self._folders[:-1]
        return nbytes

    def close(self) -> None:
        """Delete the adapter folders still on disk."""
        self._cleanup()


def _remove_folders(folders: list[str]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
