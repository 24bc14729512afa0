"""One rank of the 2-rank vs 1-rank FSDP2 comparison (run as a script, or imported by the test).

``python _fsdp2_dist_worker.py MODEL_PATH OUT_FILE`` with ``RANK``/``WORLD_SIZE``/
``MASTER_ADDR``/``MASTER_PORT`` set joins a gloo group, trains one step on its share of a fixed
batch in each scenario of ``SCENARIOS`` (micro-batches by count; by token budget with uneven
micro-batch counts across ranks; HSDP; padding-free) and rank 0 saves loss, grad norm, full
gradients and parameters to OUT_FILE.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from rlcore.engine import split_micro_batches
from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.protocol import DataProto
from rlcore_fsdp2.engine import FSDP2Engine
from rlcore_fsdp2.weights import gather_bucket

ROWS, PROMPT, RESPONSE = 8, 10, 6


def make_batch() -> DataProto:
    """8 rows, longest first, so rank 0 (rows 0-3) gets long rows and rank 1 short ones."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 250, (ROWS, PROMPT + RESPONSE), generator=g)
    attn = torch.ones(ROWS, PROMPT + RESPONSE, dtype=torch.long)
    resp_mask = torch.ones(ROWS, RESPONSE, dtype=torch.long)
    for i in range(ROWS):
        attn[i, : i + 1] = 0  # left padding grows with i: row lengths decrease
        resp_mask[i, RESPONSE - (i % 3) :] = 0
        attn[i, PROMPT + RESPONSE - (i % 3) :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT:],
            "response_mask": resp_mask,
            "advantages": torch.randn(ROWS, RESPONSE, generator=g),
        }
    )


# Token budget (padded): the long rows of rank 0 (14-16 tokens) pack one per micro-batch, the
# short rows of rank 1 (8-11 tokens) two per micro-batch, so ranks run 4 and 2 micro-batches.
TOKEN_BUDGET = 22
SCENARIOS: dict[str, tuple[dict, dict]] = {
    "count": ({"micro_batch_size": 2}, {}),
    "tokens": (
        {"micro_batch_size": None, "max_tokens_per_micro_batch": TOKEN_BUDGET},
        {"use_remove_padding": False},
    ),
    # HSDP: shard groups of 1 rank, replicated over 2 (a 1-rank run is plain FSDP).
    "hsdp": ({"micro_batch_size": 2}, {"fsdp_size": 1}),
    # Padding-free: the budget counts valid tokens; rank 0 runs 4 micro-batches, rank 1 two.
    "packed": (
        {"micro_batch_size": None, "max_tokens_per_micro_batch": TOKEN_BUDGET},
        {"use_remove_padding": True},
    ),
}


def run(model_path: str) -> dict[str, dict[str, object]]:
    """Every scenario on this rank's share; returns rank-independent results (all ranks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    share = make_batch().chunk(world)[rank]
    results: dict[str, dict[str, object]] = {}
    for name, (batching, options) in SCENARIOS.items():
        spec = EngineSpec(
            role="actor", model_path=model_path, optim=OptimConfig(lr=1e-4), **batching
        )
        engine = FSDP2Engine(spec, FSDP2Engine.Config(**options))
        losses: list[torch.Tensor] = []

        def loss_fn(outputs, mb, totals, losses=losses):
            mask = mb.batch["response_mask"].float()
            loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
            losses.append(loss.detach())
            return loss, {"loss": float(loss.detach())}

        engine.forward_backward(share, loss_fn, temperature=1.0)
        loss = torch.stack(losses).sum().reshape(1)
        dist.all_reduce(loss)  # the global token-mean loss
        counts = torch.zeros(world, dtype=torch.long)
        counts[rank] = len(
            split_micro_batches(
                share,
                micro_batch_size=spec.micro_batch_size,
                max_tokens=spec.max_tokens_per_micro_batch,
                packed=engine.config.use_remove_padding,
            )
        )
        dist.all_reduce(counts)
        grads = {}
        for pname, p in engine.model.named_parameters():
            grads[pname] = (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
        grad_norm = engine.optimizer_step(lr=1e-4)
        params = {n: t.clone() for n, t in engine.named_parameters_for_sync()}
        synced_bf16 = dict(engine.named_parameters_for_sync(dtype=torch.bfloat16))
        results[name] = {
            "loss": float(loss),
            "grad_norm": grad_norm,
            "grads": grads,
            "params": params,
            "micro_batches_per_rank": counts.tolist(),
            "sync_mismatches": sync_mismatches(engine, params, synced_bf16),
        }
    results["uneven"] = {"mismatches": uneven_gather_mismatches()}
    return results


def sync_mismatches(engine, synced, synced_bf16) -> list[str]:
    """Names whose synced tensor differs from its own ``full_tensor()`` (bit-exact compare)."""
    bad = []
    state = engine.model.state_dict()
    if list(synced) != list(state) or list(synced_bf16) != list(state):
        bad.append(f"names differ: {sorted(set(state) ^ set(synced))}")
    for name, tensor in state.items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if not torch.equal(synced[name], full) or synced[name].dtype != full.dtype:
            bad.append(name)
        if not torch.equal(synced_bf16[name], full.to(torch.bfloat16)):
            bad.append(f"{name} (bf16)")
    return bad


def uneven_gather_mismatches() -> list[str]:
    """The bucketed gather on Shard(0) DTensors whose rows do not split evenly (some empty)."""
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(2)
    shapes = [(5, 3), (1, 4), (3,), (7, 2, 2), (2, 5), ()]
    fulls = [torch.randn(shape, generator=g) for shape in shapes]
    fulls.append(torch.arange(9, dtype=torch.int64).reshape(3, 3))  # a second dtype
    bucket = []
    for i, full in enumerate(fulls):
        placements = [Replicate()] if full.ndim == 0 else [Shard(0)]
        bucket.append(([f"t{i}"], distribute_tensor(full, mesh, placements)))
    bucket.append((["plain"], torch.ones(2)))
    out = dict(gather_bucket(bucket, None, torch.device("cpu")))
    expected = {f"t{i}": full for i, full in enumerate(fulls)} | {"plain": torch.ones(2)}
    return [name for name, full in expected.items() if not torch.equal(out[name], full)]


def main() -> None:
    torch.set_num_threads(1)
    model_path, out_file = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    results = run(model_path)
    if dist.get_rank() == 0:
        torch.save(results, out_file)
    # Both ranks leave together: a rank tearing gloo down while its peer is still writing
    # results was seen to abort the peer ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
