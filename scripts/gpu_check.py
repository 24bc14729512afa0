"""GPU check: the FSDP2 engine (NCCL, bf16 mixed precision) and the HF rollout on one device.

    python scripts/gpu_check.py [--device cuda|cpu] [--steps 3]

Drives the two plugins directly, the way ``ActorRolloutRefWorker`` does (no Ray): build a
tiny Qwen2, then per step generate -> old log-probs -> advantages -> forward_backward ->
optimizer_step -> weight sync to the rollout; then offload/onload, checkpoint save/load and
export to a Hugging Face folder. Prints a table and exits 1 if a check fails.

Runs from a plain checkout: ``core/src`` and the plugins' ``src`` folders go on ``sys.path``
(needs torch, transformers, numpy, attrs). ``--device cpu`` is a dry run with gloo.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for src in ("core/src", "plugins/engines/fsdp2/src", "plugins/rollout/hf/src"):
    sys.path.insert(0, str(ROOT / src))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rlcore.engine import learning_rate  # noqa: E402
from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams  # noqa: E402
from rlcore.protocol import DataProto  # noqa: E402
from rlcore.testing.tiny_model import build_tiny_model  # noqa: E402
from rlcore_fsdp2.engine import FSDP2Engine  # noqa: E402
from rlcore_hf.rollout import HFRollout  # noqa: E402

PROMPTS = [
    "What is 12 * 7?",
    "Name three primes.",
    "Hi",
    "Explain gradient descent.",
    "2+2=",
    "Write a haiku.",
    "Count to five:",
    "The capital of France is",
]
N, NEW_TOKENS = 4, 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_prompts(tok) -> DataProto:  # noqa: ANN001
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in PROMPTS
    ]
    enc = tok(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


def advantages(batch: DataProto, digit_ids: torch.Tensor) -> torch.Tensor:
    """GRPO-style: reward = share of digit tokens in the response, normalised per prompt group."""
    resp, mask = batch.batch["responses"], batch.batch["response_mask"].float()
    reward = (torch.isin(resp, digit_ids).float() * mask).sum(-1) / mask.sum(-1).clamp(
        min=1
    )  # (B*n,)
    grouped = reward.view(-1, N)
    adv = (grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)
    return adv.view(-1, 1) * mask  # (B*n, R)


def ppo_loss(outputs, mb, totals):  # noqa: ANN001, ANN201
    """Clipped PPO surrogate, token-mean over the mini-batch (global normaliser)."""
    mask = mb.batch["response_mask"].float()
    ratio = torch.exp(outputs.log_probs - mb.batch["old_log_probs"])
    adv = mb.batch["advantages"]
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    loss = (surrogate * mask).sum() / totals.tokens
    return loss, {
        "actor/pg_loss": float(loss.detach()) * totals.tokens / max(1.0, float(mask.sum()))
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=3)
    # As a Ray worker of rank 1 sees it: LOCAL_RANK=1 with CUDA_VISIBLE_DEVICES narrowed to
    # its one GPU; the engine must pick device 0 (the worker base's rule), not ordinal 1.
    ap.add_argument("--local-rank", type=int, default=0)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipping GPU check")
        return 0
    if args.device == "cpu":
        torch.set_num_threads(1)
    # A 1-rank group through the env, as a Ray worker sets it up.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        LOCAL_RANK=str(args.local_rank),
        WORLD_SIZE="1",
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        path = str(build_tiny_model(tmp / "model", hidden=256, layers=4, heads=8, kv_heads=4))
        tok = AutoTokenizer.from_pretrained(path)
        digit_ids = torch.tensor(tok.convert_tokens_to_ids(list("0123456789")))
        spec = EngineSpec(
            role="actor",
            model_path=path,
            device=args.device,
            dtype="bfloat16",
            optim=OptimConfig(lr=1e-4, warmup_steps=1),
            total_steps=args.steps + 1,
            micro_batch_size=8,
        )
        actor = FSDP2Engine(
            spec, FSDP2Engine.Config(mixed_precision=True, offload_during_generation=True)
        )
        backend = dist.get_backend()
        rollout = HFRollout(RolloutSpec(model_path=path, device=args.device, dtype="bfloat16"))
        prompts = make_prompts(tok).repeat(N, interleave=True)  # n rows per prompt
        sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, return_log_probs=True)
        dev = actor.device

        print(
            f"\nGPU check: {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}, "
            f"backend {backend}, torch {torch.__version__}, bf16 mixed precision\n"
        )
        header = (
            f"{'step':>4} {'gen tok/s':>10} {'pg_loss':>9} {'grad_norm':>10} {'lr':>9} "
            f"{'sync s':>7} {'|Δlogp|':>8}"
        )
        print(header)
        print("-" * len(header))
        for step in range(args.steps):
            # --- rollout (actor offloaded while generating, as when colocated)
            actor.offload()
            t0 = time.perf_counter()
            gen = rollout.generate(prompts, sampling)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            gen_s = time.perf_counter() - t0
            rate = len(gen) * NEW_TOKENS / gen_s
            # --- old log-probs; they must agree with the rollout's own (same weights, bf16)
            old = actor.compute_log_prob(gen, temperature=sampling.temperature).log_probs
            mask = gen.batch["response_mask"].bool()
            delta = float((old - gen.batch["rollout_log_probs"])[mask].abs().mean())
            if delta > 0.05:
                failures.append(f"step {step}: mean |old - rollout log-prob| = {delta:.4f} > 0.05")
            batch = gen.union(
                DataProto.from_dict(
                    tensors={"old_log_probs": old, "advantages": advantages(gen, digit_ids)}
                )
            )
            # --- update
            metrics = actor.forward_backward(batch, ppo_loss, temperature=1.0)
            lr = actor.lr
            assert spec.optim is not None
            lr = learning_rate(spec.optim, step, spec.total_steps)
            grad_norm = actor.optimizer_step(lr=lr)
            if not torch.isfinite(torch.tensor(grad_norm)):
                failures.append(f"step {step}: grad norm {grad_norm}")
            # --- weight sync, streamed
            t0 = time.perf_counter()
            rollout.update_weights(actor.named_parameters_for_sync())
            sync_s = time.perf_counter() - t0
            print(
                f"{step:>4} {rate:>10.0f} {metrics['actor/pg_loss']:>9.4f} {grad_norm:>10.4f} "
                f"{lr:>9.2e} {sync_s:>7.3f} {delta:>8.4f}"
            )

        # --- after sync, the rollout's weights are the actor's (bf16 copies of fp32 masters)
        full = dict(actor.named_parameters_for_sync())
        rollout_params = {n: p.detach() for n, p in rollout.model.named_parameters()}
        worst = max(
            float((rollout_params[n].float() - full[n].float()).abs().max()) for n in rollout_params
        )
        scale = max(float(t.abs().max()) for t in full.values())
        if worst > 1e-2 * scale:
            failures.append(f"weight sync: max |rollout - actor| = {worst:.3e}")

        # --- offload frees device memory, onload restores it
        if dev.type == "cuda":
            before = torch.cuda.memory_allocated(dev)
            actor.offload()
            after = torch.cuda.memory_allocated(dev)
            actor.onload()
            print(f"\noffload: device memory {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB")
            if after >= before:
                failures.append("offload did not free device memory")

        # --- parameters and optimizer step on CPU (CPUOffloadPolicy), compute on the device
        if dev.type == "cuda":
            offloaded = FSDP2Engine(spec, FSDP2Engine.Config(offload_params=True))
            offloaded.forward_backward(batch, ppo_loss, temperature=1.0)
            norm = offloaded.optimizer_step(lr=1e-4)
            on_cpu = all(p.device.type == "cpu" for p in offloaded.model.parameters())
            print(f"offload_params engine: grad norm {norm:.4f}, shards on CPU: {on_cpu}")
            if not (on_cpu and torch.isfinite(torch.tensor(norm))):
                failures.append(f"offload_params engine: grad norm {norm}, shards on CPU {on_cpu}")
            del offloaded

        # --- checkpoint round trip and HF export (DCP over the NCCL group)
        actor.save_checkpoint(str(tmp / "ckpt"))
        actor.load_checkpoint(str(tmp / "ckpt"))
        reloaded = dict(actor.named_parameters_for_sync())
        if any(not torch.equal(reloaded[n], full[n]) for n in full):
            failures.append("checkpoint load changed the parameters")
        actor.export_hf(str(tmp / "hf"))
        exported = AutoModelForCausalLM.from_pretrained(tmp / "hf")
        if any(not torch.equal(t, full[n].cpu()) for n, t in exported.state_dict().items()):
            failures.append("exported HF weights differ from the actor's")
        print("checkpoint save/load, HF export: done")

    dist.destroy_process_group()
    if failures:
        print("\nGPU check FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nGPU check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
