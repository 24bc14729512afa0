"""LoRA vs full fine-tuning in the FSDP2 engine: trainable parameters, optimizer state,
peak memory, step time and weight-sync time, on the quickstart model and a ~20M model.

    python benchmarks/lora.py [--quickstart examples/quickstart/work/seed0/model_sft]
                              [--rows 32] [--prompt 40] [--response 24] [--steps 5]
                              [--rank 16] [--device cpu|cuda] [--threads 1]

Each (model, mode) runs in its own subprocess (a one-rank gloo/NCCL group, no Ray), so its peak
memory is its own: CPU reports the process's peak resident set (``ru_maxrss``, weights and
activations included), CUDA ``max_memory_allocated``. A step is ``forward_backward`` over
``rows`` rows (micro-batch = all rows) plus ``optimizer_step``; the first step is a warm-up.
"sync" is one full ``named_parameters_for_sync`` pass (LoRA: gathered and merged).
The learning curves of the two modes come from the quickstart itself:
``rlcore train examples/quickstart/grpo.toml`` vs ``rlcore train examples/quickstart/lora.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _one(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from rlcore.interfaces import EngineSpec, OptimConfig
    from rlcore.protocol import DataProto
    from rlcore_fsdp2.engine import FSDP2Engine

    torch.set_num_threads(args.threads)
    rank = args.rank if args.mode == "lora" else 0
    spec = EngineSpec(
        role="actor",
        model_path=args.model,
        optim=OptimConfig(lr=1e-4),
        micro_batch_size=args.rows,
        device=args.device,
    )
    engine = FSDP2Engine(spec, FSDP2Engine.Config(lora_rank=rank, lora_alpha=2.0 * max(rank, 1)))
    total = sum(p.numel() for p in engine.model.parameters())
    trainable = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)

    g = torch.Generator().manual_seed(0)
    length = args.prompt + args.response
    ids = torch.randint(3, 250, (args.rows, length), generator=g)
    attn = torch.ones_like(ids)
    batch = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": attn.cumsum(-1) - 1,
            "responses": ids[:, args.prompt :],
            "response_mask": torch.ones(args.rows, args.response, dtype=torch.long),
            "advantages": torch.randn(args.rows, args.response, generator=g),
        }
    )

    def loss_fn(outputs, mb, totals):  # type: ignore[no-untyped-def]
        mask = mb.batch["response_mask"].float()
        loss = -(outputs.log_probs * mb.batch["advantages"].to(mask.device) * mask).sum()
        return loss / totals.tokens, {}

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(args.steps + 1):
        sync()
        start = time.perf_counter()
        engine.forward_backward(batch, loss_fn, temperature=1.0)
        engine.optimizer_step(lr=1e-4)
        sync()
        if i:  # the first step is a warm-up
            times.append(time.perf_counter() - start)
    sync()
    start = time.perf_counter()
    synced = sum(t.numel() for _, t in engine.named_parameters_for_sync())
    sync()
    sync_s = time.perf_counter() - start
    assert engine.optimizer is not None
    optim_bytes = sum(
        v.numel() * v.element_size()
        for state in engine.optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return {
        "params_m": total / 1e6,
        "trainable_m": trainable / 1e6,
        "optim_mib": optim_bytes / 2**20,
        "peak_mib": peak,
        "step_s": statistics.median(times),
        "sync_s": sync_s,
        "synced_m": synced / 1e6,
    }


def _model_20m(root: Path) -> str:
    from rlcore.testing.tiny_model import build_tiny_model

    # hidden 512, 9 layers (2.3M parameters each): about 20.5M with the 259-token vocabulary.
    return str(build_tiny_model(root / "model_20m", hidden=512, layers=9, heads=8, kv_heads=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quickstart", default="examples/quickstart/work/seed0/model_sft")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--response", type=int, default=24)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        args.model, args.mode = args.one
        print(json.dumps(_one(args)))
        return

    models: list[tuple[str, str]] = []
    if (Path(args.quickstart) / "config.json").is_file():
        models.append(("quickstart", args.quickstart))
    else:
        print(f"({args.quickstart} missing: run examples/quickstart/prepare.py; skipped)")
    tmp = tempfile.TemporaryDirectory()
    models.append(("~20M", _model_20m(Path(tmp.name))))

    header = (
        f"{'model':<11}{'mode':<9}{'params M':>9}{'train M':>9}{'optim MiB':>10}"
        f"{'peak MiB':>10}{'step s':>9}{'sync s':>8}"
    )
    print(
        f"rows {args.rows} x (prompt {args.prompt} + response {args.response}), "
        f"device {args.device}, threads {args.threads}, LoRA rank {args.rank}"
    )
    print(header)
    results: dict[tuple[str, str], dict[str, float]] = {}
    for label, path in models:
        for mode in ("full", "lora"):
            argv = [sys.executable, __file__, "--one", path, mode]
            for key in ("rows", "prompt", "response", "steps", "rank", "device", "threads"):
                argv += [f"--{key}", str(getattr(args, key))]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            if out.returncode:
                print(f"{label} {mode}: failed\n{out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[(label, mode)] = r
            print(
                f"{label:<11}{mode:<9}{r['params_m']:>9.2f}{r['trainable_m']:>9.3f}"
                f"{r['optim_mib']:>10.1f}{r['peak_mib']:>10.0f}{r['step_s']:>9.3f}"
                f"{r['sync_s']:>8.3f}"
            )
    for label, _ in models:
        full, lora = results.get((label, "full")), results.get((label, "lora"))
        if full and lora:
            print(
                f"{label}: LoRA / full  step time {lora['step_s'] / full['step_s']:.2f}x, "
                f"peak memory {lora['peak_mib'] / full['peak_mib']:.2f}x, "
                f"optimizer state {lora['optim_mib'] / max(full['optim_mib'], 1e-9):.3f}x"
            )


if __name__ == "__main__":
    main()
