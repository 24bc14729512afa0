"""The colocated weight sync FSDP2 -> HF rollout, one step and one sync (run on 1 or N ranks).

Imported by ``test_colocated_sync.py`` for one rank, and run as a script by it on 2 ranks
(``python _colocated_sync.py MODEL_PATH OUT_FILE`` with ``RANK``/``WORLD_SIZE``/``MASTER_*``
set: rank 0 saves the result to OUT_FILE).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.testing.prompts import prompt_batch
from rlcore.workers.weight_push import push_weights
from rlcore_fsdp2.engine import FSDP2Engine
from rlcore_hf.rollout import HFRollout

TEMPERATURE = 0.9
GREEDY = SamplingParams(max_new_tokens=6, do_sample=False, return_log_probs=True)


def unique_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct full parameters (a tied weight once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _step(actor: FSDP2Engine, rollout: HFRollout, prompts: DataProto, seed: int) -> None:
    """One policy-gradient step on the rollout's samples (moves every weight)."""
    sampling = SamplingParams(max_new_tokens=6, temperature=TEMPERATURE)
    gen = rollout.generate(prompts, sampling)
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(len(gen), 6, generator=g)
    batch = gen.union(DataProto.from_dict(tensors={"advantages": adv}))

    def loss_fn(outputs, mb, totals):
        m = mb.batch["response_mask"].float()
        return -(outputs.log_probs * mb.batch["advantages"] * m).sum() / totals.tokens, {}

    actor.forward_backward(batch, loss_fn, temperature=TEMPERATURE)
    actor.optimizer_step(lr=5e-2)


def gap(actor: FSDP2Engine, rollout: HFRollout, prompts: DataProto) -> float:
    """Largest |rollout greedy log-prob - the engine's| over the generated tokens."""
    gen = rollout.generate(prompts, GREEDY)
    mine = actor.compute_log_prob(gen, temperature=1.0).log_probs
    assert mine is not None
    mask = gen.batch["response_mask"].bool()
    return float((mine - gen.batch["rollout_log_probs"])[mask].abs().max())


def run(model_path: str, rollout_dtype: str = "float32") -> dict[str, float]:
    """Build actor and rollout, step, sync; the bytes moved and the log-prob gaps."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_path)
    spec = EngineSpec(
        role="actor", model_path=model_path, optim=OptimConfig(lr=5e-2), micro_batch_size=4
    )
    actor = FSDP2Engine(spec, FSDP2Engine.Config())
    rollout = HFRollout(RolloutSpec(model_path=model_path, dtype=rollout_dtype))
    prompts = prompt_batch(tok, ["2+2=", "Say hi", "x", "What is 3 + 4?"])
    first = push_weights(actor, rollout)  # what init_model does
    _step(actor, rollout, prompts, seed=1 + dist.get_rank())
    stale = gap(actor, rollout, prompts)  # before the sync (0 when the storage is shared)
    sent = push_weights(actor, rollout)  # what update_actor does after the step
    synced = gap(actor, rollout, prompts)
    return {
        "first_sync_bytes": float(first),
        "sync_bytes": float(sent),
        "model_bytes": float(unique_bytes(rollout.model) * 4 // rollout.model.dtype.itemsize),
        "gap_before_sync": stale,
        "gap_after_sync": synced,
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = run(sys.argv[1])
    if dist.get_rank() == 0:
        torch.save(result, sys.argv[2])
    dist.destroy_process_group()
