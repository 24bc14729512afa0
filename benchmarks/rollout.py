"""HF rollout plugin vs raw ``model.generate`` on the same batch: tokens/s and their ratio.

    python benchmarks/rollout.py [--device cpu|cuda] [--model PATH] [--prompts 8] [--n 4]
                                 [--max-new-tokens 64] [--reps 5] [--dtype float32]

Both sides sample from the same model object with the same settings (temperature 1, top-p 1,
``num_return_sequences = n``); the raw side is a bare ``model.generate`` call, the plugin side
``HFRollout.generate`` including its post-processing (EOS mask, padding, position ids,
DataProto). Without ``--model`` a random tiny Qwen2 is built (hidden 256, 4 layers), so EOS is
rare and both sides generate the full ``max_new_tokens``. Runs interleave; medians reported.
Goal: plugin >= 0.95x raw.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore_hf.rollout import HFRollout

TEXTS = [
    "What is 12 * 7?",
    "Name three primes.",
    "Hi",
    "Explain gradient descent in one sentence.",
    "2+2=",
    "Write a haiku about the sea.",
    "Count to five:",
    "The capital of France is",
]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default=None, help="local HF folder (default: build a tiny Qwen2)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            from rlcore.testing.tiny_model import build_tiny_model

            path = str(
                build_tiny_model(Path(tmp) / "tiny", hidden=256, layers=4, heads=8, kv_heads=4)
            )
        run(path, args)


def run(path: str, args: argparse.Namespace) -> None:
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    texts = [TEXTS[i % len(TEXTS)] for i in range(args.prompts)]
    enc = tok(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )
    rollout = HFRollout(RolloutSpec(model_path=path, device=args.device, dtype=args.dtype))
    model, device = rollout.model, rollout.device
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    prompt_len = enc["input_ids"].shape[1]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def raw() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=enc["input_ids"].to(device),
                attention_mask=mask.to(device),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.max_new_tokens,
                num_return_sequences=args.n,
                eos_token_id=rollout.eos_token_ids,
                pad_token_id=rollout.pad_token_id,
            )
        sync()
        return out.shape[0] * (out.shape[1] - prompt_len)  # generated positions

    rows = prompts.repeat(args.n, interleave=True)  # the driver's expansion

    def plugin() -> int:
        out = rollout.generate(rows, sampling)
        sync()
        # Same count as raw: positions generated before the batch stopped (not the padding).
        generated = int(out.batch["response_mask"].sum(0).gt(0).sum())
        return len(out) * generated

    raw(), plugin()  # warm-up (kernels, allocator)
    times: dict[str, list[float]] = {"raw model.generate": [], "HFRollout.generate": []}
    tokens: dict[str, list[int]] = {k: [] for k in times}
    for _ in range(args.reps):
        for name, fn in (("raw model.generate", raw), ("HFRollout.generate", plugin)):
            start = time.perf_counter()
            count = fn()
            times[name].append(time.perf_counter() - start)
            tokens[name].append(count)

    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"\nrollout benchmark: {args.prompts} prompts x n={args.n}, "
        f"{args.max_new_tokens} new tokens, {n_params / 1e6:.2f} M params, "
        f"{args.dtype} on {device}, median of {args.reps}\n"
    )
    print(f"{'variant':<22}{'time (s)':>10}{'tokens':>9}{'tokens/s':>11}{'ratio':>8}")
    base = None
    for name in times:
        t = statistics.median(times[name])
        rate = statistics.median(tok_ / s for tok_, s in zip(tokens[name], times[name]))
        base = base or rate
        print(
            f"{name:<22}{t:>10.3f}{statistics.median(tokens[name]):>9.0f}"
            f"{rate:>11.1f}{rate / base:>8.3f}"
        )


if __name__ == "__main__":
    main()
