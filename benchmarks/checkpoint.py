"""Checkpoint size, save and resume time of the FSDP2 actor on a real model; resume bit-identical.

    python benchmarks/checkpoint.py --model /tmp/smollm2-hf [--dir /tmp/ckpt]

One gloo rank, AdamW: one step (so the optimizer holds its moments), ``save_checkpoint``
(timed; the folder's bytes), one more step on a fixed batch whose weights are kept; then a
fresh engine ``load_checkpoint``s (timed) and takes the same step: every parameter must equal
the uninterrupted run's bit for bit. The worker's own state (RNG, counters) is a few bytes and
is covered by the resume tests on the tiny model. Wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--dir", type=Path, help="where to write the checkpoint (default: temp)")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from rlcore.interfaces import EngineSpec, OptimConfig
    from rlcore.protocol import DataProto
    from rlcore_fsdp2.engine import FSDP2Engine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    spec = EngineSpec(
        role="actor", model_path=args.model, optim=OptimConfig(lr=1e-5), micro_batch_size=4
    )

    def make_batch(seed: int, rows: int = 4, prompt: int = 24, response: int = 8) -> DataProto:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, 40000, (rows, prompt + response), generator=g)
        mask = torch.ones_like(ids)
        return DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": mask.cumsum(-1) - 1,
                "responses": ids[:, prompt:],
                "response_mask": mask[:, prompt:],
                "advantages": torch.randn(rows, response, generator=g),
            }
        )

    first, second = make_batch(1), make_batch(2)

    def loss_fn(outputs, mb, totals):  # type: ignore[no-untyped-def]
        m = mb.batch["response_mask"].float()
        return -(outputs.log_probs * mb.batch["advantages"] * m).sum() / totals.tokens, {}

    def step(engine: FSDP2Engine, batch) -> None:  # type: ignore[no-untyped-def]
        engine.forward_backward(batch, loss_fn, temperature=1.0)
        engine.optimizer_step(lr=1e-5)

    def weights(engine: FSDP2Engine) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in engine.named_parameters_for_sync()}

    root = args.dir or Path(tempfile.mkdtemp(prefix="rlcore-ckpt-"))
    path = root / "actor"
    shutil.rmtree(path, ignore_errors=True)
    engine = FSDP2Engine(spec, FSDP2Engine.Config())
    step(engine, first)
    start = time.perf_counter()
    engine.save_checkpoint(str(path))
    save_s = time.perf_counter() - start
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    step(engine, second)
    expected = weights(engine)
    del engine

    start = time.perf_counter()
    resumed = FSDP2Engine(spec, FSDP2Engine.Config())
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    resumed.load_checkpoint(str(path))
    load_s = time.perf_counter() - start
    step(resumed, second)
    got = weights(resumed)
    differing = [n for n, t in expected.items() if not torch.equal(got[n], t)]
    print("| checkpoint | bytes | save_s | engine build_s | load_s | resumed step bit-identical |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {path} | {size:,} | {save_s:.2f} | {build_s:.2f} | {load_s:.2f} | "
        f"{'yes' if not differing else f'NO: {len(differing)} tensors differ'} |"
    )
    dist.destroy_process_group()
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
