"""megatron-core's own training wrapper: DDP grad buffers, bf16 with fp32 main params, ZeRO-1.

The plain path (:mod:`rlcore_megatron.parallel`: torch AdamW on the model's own float32
parameters, gradients summed in buckets) trains a small model anywhere. For a large one on
GPUs the engine uses megatron-core's pieces instead, the way megatron's ``training.py`` does:

- ``Float16Module`` holds the model in bfloat16 (when ``model.dtype = "bfloat16"``);
- ``DistributedDataParallel`` accumulates every gradient into contiguous per-dtype buffers
  (``param.main_grad``, float32: ``grad_reduce_in_fp32``) instead of ``param.grad``: no second
  copy of the gradients for the reduction;
- ``get_megatron_optimizer`` builds the optimizer over float32 *main* parameters
  (``Float16OptimizerWithFloat16Params``), or with ``use_distributed_optimizer`` megatron's
  ``DistributedOptimizer``: main parameters and Adam moments sharded over the data-parallel
  ranks (ZeRO-1), gradients reduce-scattered, updated parameters all-gathered.

:func:`uses_mcore_optimizer` is the probe that picks this path. Everything here also runs on
CPU inside :func:`rlcore_megatron.cpu_compat.cpu_compat` (megatron checks parameter types by
their CUDA names; the compat layer answers them), which is how the tests run it.

Loss normalisation stays rlcore's (per-token losses already divided by the mini-batch totals):
the DDP wrapper is told ``calculate_per_token_loss`` (megatron-core 0.16.1
distributed/distributed_data_parallel.py:254-259: gradient scaling factor 1, summed over DP)
and :func:`finalize_model_grads` is called without ``num_tokens`` (no rescaling,
distributed/finalize_model_grads.py:484-496).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, cast

import torch

from rlcore.engine import OptimizerGuard
from rlcore.interfaces import OptimConfig

__all__ = [
    "McoreOptimizer",
    "checkpoint_optimizer_mismatch",
    "optimizer_kind",
    "uses_mcore_optimizer",
]


def uses_mcore_optimizer(device: str, dtype: str, use_distributed_optimizer: bool) -> bool:
    """Whether a training engine takes megatron-core's DDP + optimizer (else the plain path).

    ``use_distributed_optimizer`` asks for it on any device; bfloat16 on a GPU takes it for its
    float32 main parameters. Everything else (the CPU default, float32 on GPU) keeps the plain
    path unchanged.
    """
    return use_distributed_optimizer or (device.startswith("cuda") and dtype == "bfloat16")


# What a checkpoint's optimizer state is, by kind, and the settings that train with that kind.
_KIND_SETTINGS = {
    "torch": 'model.dtype = "float32" (or any dtype on CPU) and {key} = false',
    "megatron": 'model.dtype = "bfloat16" on GPU and {key} = false',
    "megatron-distributed": "{key} = true",
}


def optimizer_kind(mcore: McoreOptimizer | None) -> str:
    """The kind of optimizer state an engine checkpoints: ``torch`` (the plain path's AdamW),
    ``megatron`` (float32 main params), ``megatron-distributed`` (their DP shards)."""
    if mcore is None:
        return "torch"
    return "megatron-distributed" if mcore.distributed else "megatron"


def checkpoint_optimizer_mismatch(
    saved: dict[str, Any], role: str, kind: str, dp: int
) -> str | None:
    """Why a training engine cannot load the optimizer state of a checkpoint (None: it can).

    ``saved`` is the engine's JSON of the checkpoint (no ``optimizer``: saved before the
    megatron path existed, the plain one); ``kind`` and ``dp`` this run's
    :func:`optimizer_kind` and data-parallel size. The kinds hold different tensors; a
    distributed optimizer's shards reload only at the data-parallel size they were saved at.
    """
    key = f"{role}.engine.use_distributed_optimizer"
    was = str(saved.get("optimizer", "torch"))
    if was != kind:
        settings = _KIND_SETTINGS.get(was, "the settings it was saved with").format(key=key)
        return (
            f"its optimizer state is {was!r}, this run's is {kind!r} (the state does not "
            f"convert): resume with {settings}, as when it was saved"
        )
    if kind == "megatron-distributed" and int(saved["layout"][2]) != dp:
        return (
            f"holds the distributed optimizer's shards of {saved['layout'][2]} data-parallel "
            f"ranks, this run has {dp} (resharding them is not supported yet)"
        )
    return None


def _flat(groups: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for group in groups for t in group]


class McoreOptimizer:
    """megatron-core's DDP wrapper and optimizer around one model stage.

    Quacks like the torch optimizer :class:`rlcore.engine.OptimizerGuard` drives
    (``param_groups``, ``step``, ``zero_grad``); :meth:`clip` is the guard's ``clip``: it
    finishes the gradient reduction (:func:`finalize_model_grads`), copies the gradients to the
    main parameters and clips them by the global norm. ``module`` is what the pipeline
    schedule runs (the DDP wrapper); the model itself is unchanged, its parameters stay the
    same ``Parameter`` objects (with the distributed optimizer, views into DDP's buffer).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: Any,
        optim: OptimConfig,
        *,
        bf16: bool,
        distributed: bool,
    ) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module

        self.bf16 = bf16
        self.distributed = distributed
        inner = Float16Module(config, model) if bf16 else model
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            # Overlap needs the schedule's no_sync around every micro-batch but the last, and
            # rlcore may accumulate several forward_backward calls per step: reduced once, at
            # optimizer_step (finish_grad_sync), as the plain path does.
            overlap_grad_reduce=False,
            use_distributed_optimizer=distributed,
        )
        self.module = DistributedDataParallel(config, ddp_config, inner)
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1],
            adam_eps=optim.eps,
            bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
            use_distributed_optimizer=distributed,
            clip_grad=0.0,  # clipped by clip() below, with the guard's non-finite skip
        )
        # config_overrides={}: every parameter decays, as torch's AdamW on the plain path
        # (None would exempt biases and 1-d params: optimizer/__init__.py:137-143, 78-94).
        self.optimizer = get_megatron_optimizer(
            opt_config, [self.module], config_overrides={}, use_gloo_process_groups=False
        )
        self._materialise_state()

    def guard(self, *, role: str, max_norm: float) -> OptimizerGuard:
        """The engine's step guard over this optimizer (non-finite skip, counters)."""
        as_torch = cast("torch.optim.Optimizer", self)  # the three members the guard uses
        return OptimizerGuard(as_torch, role=role, max_norm=max_norm)

    # --- what OptimizerGuard calls -----------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.optimizer.param_groups
        return groups

    def clip(self, max_norm: float) -> float:
        """Reduce, copy to main grads, clip to ``max_norm``; the global norm (inf on overflow)."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        finalize_model_grads([self.module], num_tokens=None)
        found_inf = self.optimizer.prepare_grads()
        norm = float(self.optimizer.get_grad_norm())
        if found_inf:
            return math.inf
        if math.isfinite(norm) and max_norm < math.inf:
            for opt in self._optimizers():
                params = opt.get_parameters()
                if params:
                    clip_grad_by_total_norm_fp32(params, max_norm, norm)
        return norm

    def step(self) -> None:
        """The inner step on the main parameters, copied back to the model (all-gathered
        over data-parallel ranks with the distributed optimizer)."""
        self.optimizer.step_with_ready_grads()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.module.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=set_to_none)

    # --- checkpoint state --------------------------------------------------------------------

    def _optimizers(self) -> list[Any]:
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def _main_params(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, Any]]:
        """(model parameter, its main parameter or this rank's shard of it, inner optimizer)."""
        from megatron.core.optimizer import DistributedOptimizer, Float16OptimizerWithFloat16Params

        for opt in self._optimizers():
            if opt.optimizer is None:
                continue
            if isinstance(opt, DistributedOptimizer):
                # distrib_optimizer.py:340-431: float16 params get float32 shard copies,
                # float32 params are sharded as views of themselves.
                pairs = [
                    *zip(
                        _flat(opt.model_float16_groups),
                        _flat(opt.shard_fp32_from_float16_groups),
                        strict=True,
                    ),
                    *zip(_flat(opt.model_fp32_groups), _flat(opt.shard_fp32_groups), strict=True),
                ]
            elif isinstance(opt, Float16OptimizerWithFloat16Params):
                pairs = [
                    *zip(
                        _flat(opt.float16_groups), _flat(opt.fp32_from_float16_groups), strict=True
                    ),
                    *((p, p) for p in _flat(opt.fp32_from_fp32_groups)),
                ]
            else:  # FP32Optimizer: the model's parameters themselves
                pairs = [(p, p) for p in opt.get_parameters()]
            for model_param, main in pairs:
                if main is not None:
                    yield model_param, main, opt.optimizer

    def _materialise_state(self) -> None:
        """Adam's state now (zero moments, step 0), so a checkpoint has the same keys before
        and after the first step, as on the plain path."""
        for opt in self._optimizers():
            inner = opt.optimizer
            if inner is None:
                continue
            if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
                for group in inner.param_groups:
                    for p in group["params"]:
                        inner.state[p] = {
                            "step": torch.zeros((), dtype=torch.float32),
                            "exp_avg": torch.zeros_like(p),
                            "exp_avg_sq": torch.zeros_like(p),
                        }
            else:  # TE / apex FusedAdam: megatron's own initialiser (optimizer/__init__.py:391-399)
                opt.init_state_fn(inner, opt.config)

    def state(self, names: dict[int, str], prefix: str) -> dict[str, torch.Tensor]:
        """Main parameters (when they are separate float32 copies) and optimizer slots, keyed
        ``{prefix}/{parameter name}/{slot}``; ``names`` maps ``id(model parameter)`` to its
        global name. With the distributed optimizer the caller's prefix names the DP rank:
        each rank holds another shard."""
        state: dict[str, torch.Tensor] = {}
        for model_param, main, inner in self._main_params():
            name = names[id(model_param)]
            if main.dtype != model_param.dtype:
                state[f"{prefix}/{name}/main"] = main
            for slot, value in inner.state[main].items():
                if isinstance(value, torch.Tensor):
                    state[f"{prefix}/{name}/{slot}"] = value
        return state

    def group_steps(self) -> list[int | None]:
        """Per-group step counters of fused optimizers (TE/apex FusedAdam keep ``step`` in the
        group, from their first step on; torch's AdamW keeps it in the state: None)."""
        return [int(g["step"]) if "step" in g else None for g in self.param_groups]

    def load_group_steps(self, steps: list[int | None]) -> None:
        """Restore :meth:`group_steps` (a fresh optimizer has no counters in its groups yet)."""
        if len(steps) != len(self.param_groups):
            msg = f"{len(steps)} saved parameter groups, the optimizer has {len(self.param_groups)}"
            raise ValueError(msg)
        for group, step in zip(self.param_groups, steps, strict=True):
            if step is None:
                group.pop("step", None)
            else:
                group["step"] = step
