"""One rank of the 2-rank LoRA test (run as a subprocess; see test_fsdp2_lora_distributed)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.protocol import DataProto
from rlcore_fsdp2.engine import FSDP2Engine

torch.set_num_threads(1)


def make_batch(rows: int = 8, prompt: int = 6, response: int = 5, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": attn.cumsum(-1) - 1,
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response, dtype=torch.long),
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def loss_fn(outputs, mb, totals):
    mask = mb.batch["response_mask"].float()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    return loss, {}


def run(model_path: str, checkpoint: str | None = None) -> dict[str, object]:
    """Train 3 LoRA steps on this rank's share of fixed batches; merged weights + log-probs."""
    spec = EngineSpec(role="actor", model_path=model_path, optim=OptimConfig(lr=2e-2))
    engine = FSDP2Engine(spec, FSDP2Engine.Config(lora_rank=8, lora_alpha=16.0))
    rank, size = dist.get_rank(), dist.get_world_size()
    for step in range(3):
        batch = make_batch(seed=step)
        share = len(batch) // size
        engine.forward_backward(
            batch.slice(rank * share, (rank + 1) * share), loss_fn, temperature=1.0
        )
        engine.optimizer_step(lr=2e-2)
    if checkpoint is not None:
        engine.save_checkpoint(checkpoint)
    merged = {n: t.detach().cpu().clone() for n, t in engine.named_parameters_for_sync()}
    log_probs = engine.compute_log_prob(make_batch(seed=9), temperature=1.0).log_probs
    return {"merged": merged, "log_probs": log_probs}


def main() -> None:
    model_path, out_file, checkpoint = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    result = run(model_path, checkpoint)
    if dist.get_rank() == 0:
        torch.save(result, out_file)
    # Both ranks leave together: a rank tearing gloo down while its peer is still writing
    # results was seen to abort the peer ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
