"""Run megatron-core on CPU: the few ``torch.cuda`` calls its forward makes, answered for CPU.

megatron-core targets GPUs: a handful of places ask ``torch.cuda.current_device()`` for the
device of a new tensor, and dropout forks a CUDA RNG state through its RNG tracker. On a
CPU-only torch those raise. :func:`cpu_compat` patches exactly these, for the duration of a
``with`` block, and restores them on exit; the engine enters it only when its device is CPU,
so a GPU run never sees it.

- ``torch.cuda.current_device()`` returns ``"cpu"`` (every megatron caller passes the result
  on as a ``device=`` argument, where a string is valid) and ``torch.cuda.synchronize()``
  does nothing;
- a tensor factory asked for ``device="cuda"`` (megatron's pipeline schedules hard-code it
  for a token counter) gets the CPU, and ``tensor.cuda()`` stays on the CPU
  (:class:`_CudaFactoriesOnCpu`, a torch function mode);
- ``tensor.type()`` (no argument) reads as on a GPU, ``torch.cuda.FloatTensor``: megatron's
  optimizers accept parameters only by these names (megatron-core 0.16.1
  optimizer/distrib_optimizer.py:361-437, optimizer/optimizer.py:671-700, otherwise
  ``TypeError: Wrapped parameters must be one of torch.cuda.FloatTensor, ...``) and its
  gradient clipping asserts them (optimizer/clip_grads.py:167); ``type(dtype)`` converts
  as ever;
- ``torch.cuda.is_available()`` keeps returning False (not patched);
- megatron's RNG tracker is replaced by :class:`CpuRNGStatesTracker`, which forks the CPU
  generator instead of a CUDA one (same semantics: named states, seeded once, restored after
  the forked block).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CpuRNGStatesTracker", "cpu_compat", "install_cpu_rng_tracker"]

_lock = threading.RLock()
_depth = 0
_saved: dict[str, Any] = {}


class CpuRNGStatesTracker:
    """megatron's ``CudaRNGStatesTracker`` interface over the CPU generator.

    ``fork(name)`` swaps the CPU RNG state for the named one, runs the block, stores the
    advanced named state and restores the caller's state: dropout inside tensor-parallel
    regions draws from its own stream, exactly as the CUDA tracker does on a GPU.
    """

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._initialized = False

    def is_initialized(self) -> bool:
        return self._initialized

    def reset(self) -> None:
        self.states_, self.seeds_, self._initialized = {}, set(), False

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._initialized = True
        self.states_ = {name: state.clone() for name, state in states.items()}

    def add(self, name: str, seed: int) -> None:
        self._initialized = True
        if seed in self.seeds_:
            msg = f"CPU RNG seed {seed} already exists"
            raise RuntimeError(msg)
        if name in self.states_:
            msg = f"CPU RNG state {name!r} already exists"
            raise RuntimeError(msg)
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            msg = f"CPU RNG state {name!r} is not added"
            raise RuntimeError(msg)
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def install_cpu_rng_tracker(seed: int) -> CpuRNGStatesTracker:
    """Make megatron's ``get_cuda_rng_tracker()`` a seeded :class:`CpuRNGStatesTracker`.

    Mirrors ``model_parallel_cuda_manual_seed``: one stream shared by the data-parallel ranks
    and one per tensor-parallel rank (offset by 2718 + tp_rank, as megatron does).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    tracker = CpuRNGStatesTracker()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + 100 + tp_rank)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return tracker


def _cpu_current_device() -> str:
    return "cpu"


def _no_synchronize(device: Any = None) -> None:
    """Nothing to wait for: CPU ops are synchronous."""


class _CudaFactoriesOnCpu(TorchFunctionMode):
    """``device="cuda"`` in a call's kwargs becomes CPU; ``Tensor.cuda()`` returns the tensor;
    ``Tensor.type()`` answers the CUDA type name."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]  # tied embeddings across stages call weight.data.cuda()
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _cuda_type_name(args[0])
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


_PATCHES = {"current_device": _cpu_current_device, "synchronize": _no_synchronize}


@contextlib.contextmanager
def cpu_compat() -> Iterator[None]:
    """Within the block, megatron's CUDA calls run on CPU (re-entrant; restored on exit)."""
    global _depth
    with _lock:
        if _depth == 0:
            for name, replacement in _PATCHES.items():
                _saved[name] = getattr(torch.cuda, name)
                setattr(torch.cuda, name, replacement)
        _depth += 1
    try:
        with _CudaFactoriesOnCpu():
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name in _PATCHES:
                    setattr(torch.cuda, name, _saved.pop(name))


def _cuda_type_name(tensor: torch.Tensor) -> str:
    """``tensor.type()`` as on a GPU: ``torch.FloatTensor`` -> ``torch.cuda.FloatTensor``."""
    name: str = torch.Tensor.type(tensor)
    return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
