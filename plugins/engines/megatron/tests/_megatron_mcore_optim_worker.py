"""One rank of the 2-process runs of megatron-core's DDP + optimizer (test_megatron_mcore_optim).

argv: out_dir, then scenarios ``NAME:TP:PP:DTYPE:DISTRIBUTED:MODEL_PATH`` (DISTRIBUTED 0/1:
``use_distributed_optimizer``; ``gpu``: not set, and the engine's probe answers as for a CUDA
device, which takes bfloat16 to megatron's ``Float16OptimizerWithFloat16Params``). Each
scenario builds an actor engine (megatron's parallel state rebuilt between scenarios), takes
two optimizer steps on the test batch (each data-parallel rank on its half), saves a
checkpoint, takes a third step, loads the checkpoint and computes the log-probs again. Rank 0
writes ``out_dir/NAME.pt`` (tensors only, read back with ``weights_only=True``). Env: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from _common import make_batch, token_mean_loss

import rlcore_megatron.engine as engine_module
from rlcore.interfaces import EngineSpec, OptimConfig
from rlcore_megatron.checkpoint_io import engine_state
from rlcore_megatron.engine import MegatronEngine, MegatronError
from rlcore_megatron.mcore_optimizer import uses_mcore_optimizer


def _probe_as_on_gpu(device: str, dtype: str, use_distributed_optimizer: bool) -> bool:
    return uses_mcore_optimizer("cuda", dtype, use_distributed_optimizer)


def run(name: str, tp: int, pp: int, dtype: str, distributed: bool, model_path: str, out: Path):
    from megatron.core import parallel_state

    spec = EngineSpec(
        role="actor",
        model_path=model_path,
        optim=OptimConfig(lr=1e-3),
        micro_batch_size=2,
        dtype=dtype,
        grad_clip=1.0,
    )
    config = MegatronEngine.Config(
        tensor_parallel=tp, pipeline_parallel=pp, use_distributed_optimizer=distributed
    )
    engine = MegatronEngine(spec, config)
    layout = engine.layout
    batch = make_batch().chunk(layout.dp)[layout.dp_rank]  # mesh dispatch: one chunk per DP
    losses, norms = [], []
    for step in range(2):
        losses.append(engine.forward_backward(batch, token_mean_loss, temperature=1.0)["loss"])
        if step == 0:  # where the gradients are before the step
            live = [p for p in engine.model.parameters() if p.requires_grad]
            in_buffers = engine.mcore_optimizer is not None and all(
                p.grad is None and p.main_grad.abs().sum() > 0 for p in live
            )
            in_grads = all(p.grad is not None for p in live)
        norms.append(engine.optimizer_step(lr=1e-3))
    # Adam's first moments this rank holds, against its parameters (ZeRO-1 shards them)
    optim_state = engine_state(engine)  # the checkpoint's tensors of this rank
    moment_numel = sum(t.numel() for k, t in optim_state.items() if k.endswith("/exp_avg"))
    param_numel = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    params = {n: t.float().clone() for n, t in engine.named_parameters_for_sync()}
    before = engine.compute_log_prob(batch, temperature=1.0).log_probs
    ckpt = out / f"{name}_checkpoint"
    engine.save_checkpoint(str(ckpt))
    engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    engine.optimizer_step(lr=1e-3)
    moved = engine.compute_log_prob(batch, temperature=1.0).log_probs
    engine.load_checkpoint(str(ckpt))
    restored = engine.compute_log_prob(batch, temperature=1.0).log_probs
    # the step after the reload equals the step after the save (optimizer state restored)
    engine.forward_backward(batch, token_mean_loss, temperature=1.0)
    engine.optimizer_step(lr=1e-3)
    again = engine.compute_log_prob(batch, temperature=1.0).log_probs
    mismatch = ""
    if distributed:  # the same checkpoint into a plain optimizer: one line, naming the key
        plain = MegatronEngine(
            spec, MegatronEngine.Config(tensor_parallel=tp, pipeline_parallel=pp)
        )
        try:
            plain.load_checkpoint(str(ckpt))
        except MegatronError as err:
            mismatch = str(err)
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [before, restored, moved, again])
    if dist.get_rank() == 0:
        torch.save(
            {
                "losses": torch.tensor(losses),
                "grad_norms": torch.tensor(norms),
                "params": params,
                "log_probs": torch.cat([g[0] for g in gathered][: layout.dp])
                if tp * pp == 1
                else before,
                "restored_equal": torch.tensor(all(torch.equal(g[0], g[1]) for g in gathered)),
                "moved": torch.tensor(any(not torch.equal(g[0], g[2]) for g in gathered)),
                "again_equal": torch.tensor(all(torch.equal(g[2], g[3]) for g in gathered)),
                "mismatch_error": mismatch,
                "uses_mcore": torch.tensor(engine.mcore_optimizer is not None),
                "param_dtype": str(next(engine.model.parameters()).dtype),
                "grads_in_buffers": torch.tensor(in_buffers),
                "grads_in_param_grad": torch.tensor(in_grads),
                "moment_numel": torch.tensor(moment_numel),
                "param_numel": torch.tensor(param_numel),
            },
            out / f"{name}.pt",
        )
    dist.barrier()
    parallel_state.destroy_model_parallel()


def main() -> None:
    out_dir = Path(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    for scenario in sys.argv[2:]:
        name, tp, pp, dtype, distributed, model_path = scenario.split(":", 5)
        # a test double of the device probe only: everything else runs as it does on CPU
        engine_module.uses_mcore_optimizer = (  # type: ignore[assignment]
            _probe_as_on_gpu if distributed == "gpu" else uses_mcore_optimizer
        )
        run(name, int(tp), int(pp), dtype, distributed == "1", model_path, out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
