"""GPU check of the vLLM rollout: generate, log-probs, weight sync, sleep/wake on one device.

    python scripts/gpu_check_vllm.py [--device cuda|cpu] [--dtype bfloat16|float32]

Builds a tiny Qwen2 (hidden 256, 4 layers, 8 heads of 32), starts ``VLLMRollout`` and checks:
greedy responses against the HF rollout (same weights; counted, not required to be equal in
bfloat16), the rollout's log-probs against the HF model's, ``update_weights`` with perturbed
weights changes the greedy output and the originals bring it back exactly, and ``sleep`` frees
device memory that ``wake_up`` restores with the same outputs. Prints a table; exits 1 if a
check fails. ``--device cpu`` is a dry run on the vLLM CPU build (sleep is a no-op there).

Runs from a plain checkout: ``core/src`` and the plugins' ``src`` folders go on ``sys.path``;
needs vLLM itself (``scripts/gpu_check.sh`` skips this step, saying how to install it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for src in ("core/src", "plugins/rollout/hf/src", "plugins/rollout/vllm/src"):
    sys.path.insert(0, str(ROOT / src))

import torch  # noqa: E402

from rlcore.interfaces import RolloutSpec, SamplingParams  # noqa: E402
from rlcore.protocol import DataProto  # noqa: E402
from rlcore.testing.tiny_model import build_tiny_model  # noqa: E402
from rlcore_hf.rollout import HFRollout  # noqa: E402
from rlcore_vllm.rollout import VLLMRollout  # noqa: E402

TEXTS = [f"What is {i} + {2 * i + 1}?" for i in range(32)]
NEW_TOKENS = 32


def make_prompts(path: str) -> DataProto:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in TEXTS
    ]
    enc = tok(chats, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


def hf_log_probs(model, out: DataProto) -> torch.Tensor:  # noqa: ANN001
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in out.batch.items()}
    p = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits.float()[:, p - 1 : -1]
    lp = torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return (lp * batch["response_mask"]).cpu()


def device_mib(device: str) -> float:
    if device != "cuda":
        return 0.0
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipping the vLLM GPU check")
        return 0
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "m", hidden=256, layers=4, heads=8, kv_heads=4))
        spec = RolloutSpec(
            model_path=path,
            device=args.device,
            dtype=args.dtype,
            max_prompt_length=64,
            max_response_length=NEW_TOKENS,
        )
        start = time.perf_counter()
        rollout = VLLMRollout(spec, VLLMRollout.Config(gpu_memory_utilization=0.3))
        print(f"vLLM engine start: {time.perf_counter() - start:.1f} s on {args.device}")
        hf = HFRollout(spec)
        prompts = make_prompts(path)
        greedy = SamplingParams(do_sample=False, max_new_tokens=NEW_TOKENS)

        ours = rollout.generate(prompts, greedy)
        ref = hf.generate(prompts, greedy)
        same = int((ours.batch["responses"] == ref.batch["responses"]).all(1).sum())
        print(f"greedy rows equal to the HF rollout: {same}/{len(TEXTS)} ({args.dtype})")
        if args.dtype == "float32" and same != len(TEXTS):
            failures.append(f"float32 greedy: {same}/{len(TEXTS)} rows equal the HF rollout")

        sampled = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, return_log_probs=True)
        out = rollout.generate(prompts, sampled)
        mask = out.batch["response_mask"].bool()
        diff = (out.batch["rollout_log_probs"] - hf_log_probs(hf.model, out)).abs()[mask]
        print(f"log-prob |vLLM - HF model|: mean {diff.mean():.2e}, max {diff.max():.2e}")
        limit = 1e-3 if args.dtype == "float32" else 0.5
        if float(diff.mean()) > limit / 10 or not torch.isfinite(diff).all():
            failures.append(f"log-prob mean diff {float(diff.mean()):.3g} over {limit / 10}")

        original = {k: v.float().cpu() for k, v in hf.model.state_dict().items()}
        before = ours.batch["responses"]
        start = time.perf_counter()
        rollout.update_weights((k, 1.5 * v) for k, v in original.items())
        sync_s = time.perf_counter() - start
        changed = rollout.generate(prompts, greedy).batch["responses"]
        rollout.update_weights(iter(original.items()))
        back = rollout.generate(prompts, greedy).batch["responses"]
        print(
            f"weight sync: {sync_s * 1e3:.0f} ms; perturbed output changed: "
            f"{not torch.equal(changed, before)}; originals restore it: "
            f"{torch.equal(back, before)}"
        )
        if torch.equal(changed, before):
            failures.append("update_weights with perturbed weights left greedy outputs unchanged")
        if not torch.equal(back, before):
            failures.append("update_weights with the original weights did not restore outputs")

        awake = device_mib(args.device)
        rollout.sleep()
        asleep = device_mib(args.device)
        rollout.wake_up()
        rollout.update_weights(iter(original.items()))  # level 2 drops weights; harmless at 1
        after = rollout.generate(prompts, greedy).batch["responses"]
        print(
            f"sleep: device memory {awake:.0f} MiB -> {asleep:.0f} MiB; outputs after wake_up "
            f"equal: {torch.equal(after, before)}"
        )
        if args.device == "cuda" and not asleep < awake:
            failures.append("sleep() freed no device memory")
        if not torch.equal(after, before):
            failures.append("outputs after sleep/wake_up differ")
        rollout.shutdown()
    if failures:
        print("\nvLLM GPU check FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nvLLM GPU check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
