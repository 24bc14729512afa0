"""GPU check of the FSDP2 -> vLLM weight sync: after a training step, vLLM's log-probs must match
the trainer's, in the colocated memory order, with the device memory of each phase printed.

    python scripts/gpu_check_sync.py [--device cuda|cpu] [--steps 2] [--break-sync] [--lora]
                                     [--weight-sync auto|cuda_ipc|files]

Per step, as a colocated policy worker runs it: the FSDP2 actor (bf16 mixed precision on a GPU)
takes an optimizer step with a large learning rate (so the weights move visibly), streams its
weights into vLLM (``named_parameters_for_sync`` -> ``update_weights``), is offloaded, vLLM
generates with its own log-probs, the actor is loaded back and recomputes them; the mean
|vLLM - trainer| log-prob must stay under the bound (bf16: 0.05, float32: 1e-3). The rollout is
built after the actor is offloaded (it sizes its KV cache from what is free) and sleeps while
the actor trains. ``--break-sync`` skips the weight copy: the check must then FAIL. On the vLLM
CPU build (float32) ``--device cpu`` passes (mean |vLLM - trainer| 2.6e-7, measured 2026-12-03)
and ``--device cpu --break-sync`` fails (0.47 at step 0); plugins/rollout/vllm/tests runs both.

``--lora``: the actor trains a LoRA adapter (rank 8) and the rollout has ``lora_sync =
"adapter"``: each sync (``rlcore.roles.policy.push_weights``, as the policy worker runs it)
sends only the adapter, which vLLM serves as a LoRA request under a new id; the bytes of the
adapter sync and of the merged weights it replaces are printed per step.
``--weight-sync``: the rollout's ``weight_sync``. On a GPU the rollout runs vLLM's async engine
(a subprocess), so ``cuda_ipc`` syncs through vLLM's CUDA IPC backend (``rlcore_vllm.cuda_ipc``)
and ``files`` through safetensors buckets; the transport used is printed, and a forced one that
was not used FAILs the check. On CPU the engine is in-process: the tensors go directly.
Exits 77 (SKIP) without a CUDA device for ``--device cuda``.

Runs from a plain checkout (``core/src`` and the plugins' ``src`` on ``sys.path``); needs vLLM.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import N, _free_port, advantages, make_prompts, ppo_loss

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins/rollout/vllm/src"))

import torch  # noqa: E402

from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams  # noqa: E402
from rlcore.protocol import DataProto  # noqa: E402
from rlcore.testing.tiny_model import build_tiny_model  # noqa: E402
from rlcore_fsdp2.engine import FSDP2Engine  # noqa: E402


class Memory:
    """Device memory in use (all processes: total - free) after each phase, and the peak."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.rows: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        if self.device != "cuda":
            return
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        self.rows.append((phase, (total - free) / 2**20))

    def report(self) -> None:
        if not self.rows:
            print("memory: not measured on CPU")
            return
        print(f"\n{'phase':<34} {'device MiB in use':>18}")
        for phase, mib in self.rows:
            print(f"{phase:<34} {mib:>18.0f}")
        peak = max(self.rows, key=lambda r: r[1])
        print(f"peak: {peak[1]:.0f} MiB at '{peak[0]}'")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--break-sync", action="store_true", help="skip the weight copy (must FAIL)")
    ap.add_argument("--lora", action="store_true", help="LoRA actor, adapter-only sync")
    ap.add_argument(
        "--weight-sync",
        default="auto",
        choices=["auto", "cuda_ipc", "files"],
        help="[rollout] weight_sync (cuda_ipc: vLLM's CUDA IPC backend, GPU only)",
    )
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipping the FSDP2 -> vLLM sync check")
        return 77
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    bound = 0.05 if dtype == "bfloat16" else 1e-3
    if args.device == "cpu":
        torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
    )
    from transformers import AutoTokenizer

    from rlcore.roles.policy import push_weights
    from rlcore_vllm.rollout import VLLMRollout
    from rlcore_vllm.weights import tensor_bytes

    memory = Memory(args.device)
    memory.mark("start")
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "m", hidden=256, layers=4, heads=8, kv_heads=4))
        tok = AutoTokenizer.from_pretrained(path)
        digit_ids = torch.tensor(tok.convert_tokens_to_ids(list("0123456789")))
        spec = EngineSpec(
            role="actor",
            model_path=path,
            device=args.device,
            dtype=dtype,
            optim=OptimConfig(lr=1e-2),
            total_steps=args.steps + 1,
            micro_batch_size=8,
        )
        lora = {"lora_rank": 8, "lora_alpha": 16.0} if args.lora else {}
        actor = FSDP2Engine(spec, FSDP2Engine.Config(mixed_precision=args.device == "cuda", **lora))
        memory.mark("actor built")
        actor.offload()
        memory.mark("actor offloaded")
        rollout = VLLMRollout(
            RolloutSpec(
                model_path=path,
                device=args.device,
                dtype=dtype,
                max_prompt_length=64,
                max_response_length=32,
            ),
            VLLMRollout.Config(
                gpu_memory_utilization=0.3,
                lora_sync="adapter" if args.lora else "merged",
                max_lora_rank=8,
                weight_sync=args.weight_sync,
            ),
        )
        memory.mark("rollout built (after offload)")
        print(f"weight sync transport: {rollout.weight_sync} (weight_sync = {args.weight_sync})")
        # A forced transport must be the one used (files on an in-process engine: direct).
        used = {args.weight_sync, "direct"} if args.weight_sync == "files" else {args.weight_sync}
        if args.weight_sync != "auto" and rollout.weight_sync not in used:
            failures.append(f"weight_sync = {args.weight_sync} used {rollout.weight_sync}")
        prompts = make_prompts(tok).repeat(N, interleave=True)
        sampling = SamplingParams(max_new_tokens=32, temperature=1.0, return_log_probs=True)
        gen = rollout.generate(prompts, sampling)
        rollout.sleep()
        memory.mark("rollout asleep")
        print(f"{'step':>4} {'mean |vLLM - trainer| log-prob':>32} {'max':>10} {'bound':>8}")
        for step in range(args.steps):
            # --- train: the rollout sleeps, the actor is resident
            actor.onload()
            memory.mark(f"step {step}: actor onloaded")
            old = actor.compute_log_prob(gen, temperature=1.0).log_probs
            batch = gen.union(
                DataProto.from_dict(
                    tensors={"old_log_probs": old, "advantages": advantages(gen, digit_ids)}
                )
            )
            actor.forward_backward(batch, ppo_loss, temperature=1.0)
            actor.optimizer_step(lr=1e-2)
            memory.mark(f"step {step}: actor trained")
            # --- sync (verl's order): vLLM's weights wake (update_weights does it), take the
            # new weights; the actor leaves the device; the KV cache wakes at generate
            if not args.break_sync:
                sent = push_weights(actor, rollout)
                merged = tensor_bytes(actor.named_parameters_for_sync())
                what = "adapter-only" if args.lora else "full weights"
                print(f"step {step}: sync sent {sent} bytes ({what}); merged: {merged} bytes")
            else:
                rollout.wake_up_weights()
            memory.mark(f"step {step}: synced (weights only woken)")
            actor.offload()
            memory.mark(f"step {step}: actor offloaded")
            # --- generate with vLLM's own log-probs, then the trainer recomputes them
            gen = rollout.generate(prompts, sampling)
            memory.mark(f"step {step}: generated")
            rollout.sleep()
            actor.onload()
            mine = actor.compute_log_prob(gen, temperature=1.0).log_probs
            mask = gen.batch["response_mask"].bool()
            gap = (mine - gen.batch["rollout_log_probs"])[mask].abs()
            delta = float(gap.mean())
            print(f"{step:>4} {delta:>32.3e} {float(gap.max()):>10.3e} {bound:>8.0e}")
            if not delta <= bound:
                failures.append(
                    f"step {step}: mean |vLLM - trainer| log-prob {delta:.3e} > {bound:g}"
                )
            actor.offload()
        rollout.shutdown()
    memory.report()
    if failures:
        print("\nFSDP2 -> vLLM sync check FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nFSDP2 -> vLLM sync check passed")
    return 0


if __name__ == "__main__":
    from rlcore.errors import RlcoreError

    try:
        sys.exit(main())
    except RlcoreError as err:  # a config this check cannot run (one line, not a traceback)
        print(f"FSDP2 -> vLLM sync check FAILED: {err}")
        sys.exit(1)
