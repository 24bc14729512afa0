"""GPU check: megatron bf16 + distributed optimizer steps against float32, on one device.

    python plugins/engines/megatron/scripts/gpu_check_bf16.py [--device cuda|cpu] [--steps 2]

Builds a tiny Qwen2 and trains it twice from the same weights on the same batch: the plain
path (float32 parameters, torch AdamW) and megatron-core's path (model in bfloat16 through
``Float16Module``, ``DistributedDataParallel`` grad buffers reduced in float32,
``DistributedOptimizer`` over float32 main parameters; ``model.dtype = "bfloat16"`` with
``use_distributed_optimizer = true``). Checks: the bf16 engine took megatron's path, its
parameters are bfloat16 and its gradients live in megatron's buffers; grad norms and
parameters after the steps equal float32's to bfloat16 precision; a checkpoint save -> step
-> load restores the log-probs exactly. One rank: the optimizer shards over one
data-parallel rank (the sharding itself is tested on 2 CPU processes by
tests/test_megatron_mcore_optim.py). Prints a table; exits 1 if a check fails.
``--device cpu`` is a dry run with gloo and the CPU compatibility layer.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
for src in ("core/src", "plugins/engines/megatron/src", "plugins/engines/megatron/scripts"):
    sys.path.insert(0, str(ROOT / src))

import torch  # noqa: E402
from gpu_check import CheckTable, checkpoint_restores, loss_fn, make_batch, parse_args  # noqa: E402

from rlcore.interfaces import EngineSpec, OptimConfig  # noqa: E402
from rlcore.testing.tiny_model import build_tiny_model  # noqa: E402
from rlcore_megatron.engine import MegatronEngine  # noqa: E402

# bfloat16 keeps 8 bits of mantissa: parameters of magnitude ~1 move in steps of 2**-8; on 2
# CPU processes the same comparison measured 3.8e-3 (tests/test_megatron_mcore_optim.py).
PARAM_TOLERANCE = 8e-3
NORM_REL_TOLERANCE = 1e-2


def train(
    path: str, device: str, dtype: str, *, distributed: bool, steps: int
) -> tuple[MegatronEngine, list[float], list[float]]:
    spec = EngineSpec(
        role="actor",
        model_path=path,
        device=device,
        dtype=dtype,
        optim=OptimConfig(lr=1e-3),
        micro_batch_size=4,
        grad_clip=1.0,
    )
    engine = MegatronEngine(spec, MegatronEngine.Config(use_distributed_optimizer=distributed))
    batch = make_batch(device)
    losses, norms = [], []
    for _ in range(steps):
        losses.append(engine.forward_backward(batch, loss_fn, temperature=1.0)["loss"])
        norms.append(engine.optimizer_step(lr=1e-3))
    return engine, losses, norms


def main() -> int:
    args = parse_args(steps=2)
    check = CheckTable("megatron bf16 GPU check", width=36)

    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "model", hidden=256, layers=4, heads=8))
        fp32, fp32_losses, fp32_norms = train(
            path, args.device, "float32", distributed=False, steps=args.steps
        )
        reference = {n: t.float().cpu() for n, t in fp32.named_parameters_for_sync()}
        del fp32
        bf16, losses, norms = train(
            path, args.device, "bfloat16", distributed=True, steps=args.steps
        )
        mcore = bf16.mcore_optimizer
        dtype = next(bf16.model.parameters()).dtype
        check(
            "megatron path (bf16, dist. optimizer)",
            f"params {dtype}",
            mcore is not None and mcore.distributed and mcore.bf16 and dtype == torch.bfloat16,
        )
        rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms, fp32_norms, strict=True))
        check(
            "grad norms vs float32",
            f"{norms[0]:.4f} vs {fp32_norms[0]:.4f}, max rel {rel:.1e}",
            all(map(math.isfinite, norms)) and rel < NORM_REL_TOLERANCE,
        )
        got = {n: t.float().cpu() for n, t in bf16.named_parameters_for_sync()}
        diff = max(float((got[n] - t).abs().max()) for n, t in reference.items())
        check(
            f"params after {args.steps} steps vs float32",
            f"max |diff| {diff:.2e}",
            set(got) == set(reference) and diff < PARAM_TOLERANCE,
        )
        check(
            "loss moves as float32's",
            f"{losses[0]:.4f} -> {losses[-1]:.4f} (fp32 {fp32_losses[0]:.4f} -> "
            f"{fp32_losses[-1]:.4f})",
            abs((losses[-1] - losses[0]) - (fp32_losses[-1] - fp32_losses[0])) < 1e-2,
        )
        batch = make_batch(args.device)
        bf16.forward_backward(batch, loss_fn, temperature=1.0)
        live = [p for p in bf16.model.parameters() if p.requires_grad]
        in_buffers = all(p.grad is None and getattr(p, "main_grad", None) is not None for p in live)
        check("gradients in megatron's buffers", str(in_buffers), in_buffers)
        bf16.optimizer_step(lr=1e-3)
        ok = checkpoint_restores(bf16, batch, Path(tmp) / "ckpt")
        check("checkpoint save/load", "log-probs restored", ok)
    return check.finish(args.device)


if __name__ == "__main__":
    sys.exit(main())
