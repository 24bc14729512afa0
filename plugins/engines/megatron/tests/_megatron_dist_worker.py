"""One rank of the 2-process megatron engine runs (launched by test_megatron_distributed).

argv: out_dir, then scenarios ``NAME:TP:PP:MODEL_PATH``. Env: RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT. Each scenario builds an actor engine with that layout (megatron's parallel
state is rebuilt between scenarios), computes logits and log-probs, takes one optimizer step
on the test batch (each data-parallel rank on its half), without pipelining also the role
trainer's step with zero-advantage rows left out (on a fresh copy), and rank 0 writes
``out_dir/NAME.pt`` (tensors only, read back with ``weights_only=True``).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _common import make_batch, token_mean_loss, zero_advantage_batch

from rlcore.dispatch import DispatchInfo
from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore.roles.update import RoleTrainer
from rlcore.trainer.specs import UpdateSpec
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
    engine.save_checkpoint(str(out_dir / f"{name}_checkpoint"))  # read back on one process
    mismatch = ""
    if name == "tp2":  # plain DP dispatch would hand the two TP ranks different rows
        try:
            engine.compute_log_prob(make_batch(seed=dist.get_rank()), temperature=1.0)
        except MegatronError as err:
            mismatch = str(err)
    skip_grad_norm = _skip_rows_grad_norm(spec, engine) if pp == 1 else float("nan")
    infos: list[DispatchInfo | None] = [None] * dist.get_world_size()
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
                "dispatch": torch.tensor(
                    [[i.dp_rank, i.dp_size, int(i.is_collect)] for i in infos if i is not None]
                ),
                "skip_grad_norm": torch.tensor(skip_grad_norm),
            },
            out_dir / f"{name}.pt",
        )
    dist.barrier()
    parallel_state.destroy_model_parallel()


def _skip_rows_grad_norm(spec: EngineSpec, engine: MegatronEngine) -> float:
    """The role trainer's step, zero-advantage rows left out, on a fresh copy of the model.

    Rows 0 and 2 of the test batch get advantage 0; their totals must still count once per
    data-parallel group (not once per rank: TP ranks hold the same rows).
    """
    probe = MegatronEngine(spec, engine.config)
    layout = probe.layout
    batch = zero_advantage_batch().chunk(layout.dp)[layout.dp_rank]
    update = UpdateSpec(
        rows_per_mini_batch=4,
        mini_batches=1,
        epochs=1,
        shuffle=False,
        seed=0,
        optim=OptimConfig(lr=1e-3),
        schedule_steps=10,
    )
    trainer = RoleTrainer(
        "actor",
        probe,
        update,
        skip_zero_advantage_rows=True,
        replicas=dist.get_world_size() // layout.dp,
    )
    metrics: dict[str, list[float]] = {}
    trainer.run(
        token_mean_loss,
        batch,
        step=0,
        temperature=1.0,
        with_entropy=False,
        metrics=metrics,
        timing={},
    )
    assert metrics["actor/skipped_rows_frac"] == [0.5]  # 2 of 4 rows, or 1 of 2 per DP rank
    return metrics["actor/grad_norm"][0]


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
