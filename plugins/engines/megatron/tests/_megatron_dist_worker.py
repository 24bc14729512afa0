"""One rank of the 2-process megatron engine runs (launched by test_megatron_distributed).

argv: out_dir, then scenarios ``NAME:TP:PP:MODEL_PATH``. Env: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT. Each scenario builds an actor engine with that layout (megatron's parallel
state is rebuilt between scenarios), computes logits and log-probs, takes one optimizer step
on the test batch (each data-parallel rank on its half) and rank 0 writes
``out_dir/NAME.pt`` (tensors only, read back with ``weights_only=True``).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _common import make_batch, token_mean_loss

from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore_megatron.engine import MegatronEngine, MegatronError


def run(name: str, tp: int, pp: int, model_path: str, out_dir: Path) -> None:
    from megatron.core import parallel_state

    spec = EngineSpec(
        role="actor", model_path=model_path, optim=OptimConfig(lr=1e-3), micro_batch_size=2
    )
    engine = MegatronEngine(spec, MegatronEngine.Config(tensor_parallel=tp, pipeline_parallel=pp))
    layout = engine.layout
    batch = make_batch().chunk(layout.dp)[layout.dp_rank]  # mesh dispatch: one chunk per DP
    logits = engine.compute_logits(batch)
    log_probs = engine.compute_log_prob(batch, temperature=1.0).log_probs
    metrics = engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    grad_norm = engine.optimizer_step(lr=1e-3)
    params = {n: t.clone() for n, t in engine.named_parameters_for_sync()}
    mismatch = ""
    if name == "tp2":  # plain DP dispatch would hand the two TP ranks different rows
        try:
            engine.compute_log_prob(make_batch(seed=dist.get_rank()), temperature=1.0)
        except MegatronError as err:
            mismatch = str(err)
    infos: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(infos, engine.dispatch_info())
    if dist.get_rank() == 0:
        torch.save(
            {
                "logits": logits,
                "log_probs": log_probs,
                "loss": torch.tensor(metrics["loss"]),
                "grad_norm": torch.tensor(grad_norm),
                "params": params,
                "mismatch_error": mismatch,
                # (dp_rank, dp_size, is_collect) of every rank
                "dispatch": torch.tensor([[int(v) for v in i.values()] for i in infos]),
            },
            out_dir / f"{name}.pt",
        )
    dist.barrier()
    parallel_state.destroy_model_parallel()


def main() -> None:
    out_dir = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    for scenario in sys.argv[2:]:
        name, tp, pp, model_path = scenario.split(":", 3)
        run(name, int(tp), int(pp), model_path, out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
