"""Peak memory of response log-probs: chunked (rlcore.engine) vs one-shot, vocab >= 32k.

    python benchmarks/logprob_memory.py                    # vocab 32768, 8 x 256 tokens
    python benchmarks/logprob_memory.py --vocab 151936 --rows 4 --tokens 512

Two measurements, each variant in a fresh process (peak RSS above the baseline after the
inputs exist, from ``resource.getrusage``; torch's CPU allocator is invisible to tracemalloc):

- **log-probs only**: bf16 (rows, tokens, vocab) logits -> float32 log-probs (no grad), as the
  old-log-prob and reference passes do.
- **model**: a random Qwen2 with that vocabulary (hidden 256, 2 layers; ``--dtype`` of the
  compute, float32 master weights), the FSDP2 engine's
  ``compute_log_prob`` and ``forward_backward``, with ``log_prob_chunk_tokens`` 0 (one chunk)
  and the default.

The one-shot path holds a float32 copy of the logits plus the same again for ``exp``;
chunked, the float32 temporaries are (chunk, vocab). The logits the model's lm_head returns
(model dtype, only the R+1 last positions) exist either way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child_logits(rows: int, tokens: int, vocab: int, chunk: int) -> dict[str, float]:
    import torch

    from rlcore.engine import log_probs_from_logits

    torch.set_num_threads(1)
    logits = torch.randn(rows, tokens, vocab, dtype=torch.bfloat16)
    labels = torch.randint(0, vocab, (rows, tokens))
    base = _rss_mb()
    with torch.no_grad():
        log_probs_from_logits(logits, labels, chunk_tokens=chunk or None)
    return {"peak_above_inputs_mb": _rss_mb() - base}


def child_model(rows: int, tokens: int, vocab: int, chunk: int) -> dict[str, float]:
    import tempfile
    from pathlib import Path

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlcore.interfaces import EngineSpec, OptimConfig
    from rlcore.protocol import DataProto
    from rlcore_fsdp2.engine import FSDP2Engine

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(tmp)
    spec = EngineSpec(
        role="actor",
        model_path=str(tmp),
        optim=OptimConfig(lr=1e-5),
        micro_batch_size=rows,
        dtype=os.environ.get("LOGPROB_BENCH_DTYPE", "float32"),
    )
    engine = FSDP2Engine(spec, FSDP2Engine.Config(log_prob_chunk_tokens=chunk))
    prompt = 16
    ids = torch.randint(0, vocab, (rows, prompt + tokens))
    data = DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(prompt + tokens).expand(rows, -1).contiguous(),
        "responses": ids[:, prompt:], "response_mask": torch.ones(rows, tokens, dtype=torch.long),
        "advantages": torch.randn(rows, tokens)})  # fmt: skip

    def loss_fn(outputs, mb, totals):
        loss = -(outputs.log_probs * mb.batch["advantages"]).sum() / totals.tokens
        return loss, {}

    base = _rss_mb()
    engine.compute_log_prob(data, temperature=1.0)
    after_inference = _rss_mb() - base
    engine.forward_backward(data, loss_fn, temperature=1.0)
    return {"compute_log_prob_peak_mb": after_inference, "with_backward_peak_mb": _rss_mb() - base}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--child", choices=("logits", "model"), help=argparse.SUPPRESS)
    parser.add_argument("--child-chunk", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        fn = child_logits if args.child == "logits" else child_model
        print(json.dumps(fn(args.rows, args.tokens, args.vocab, args.child_chunk)))
        return 0
    shape = f"{args.rows} x {args.tokens} x {args.vocab}"
    print(f"logits {shape}; float32 copy alone = "
          f"{args.rows * args.tokens * args.vocab * 4 / 2**20:.0f} MB")  # fmt: skip
    for what in ("logits", "model"):
        for label, chunk in (("one-shot", 0), (f"chunked ({args.chunk})", args.chunk)):
            cmd = [sys.executable, __file__, "--child", what, "--child-chunk", str(chunk),
                   "--vocab", str(args.vocab), "--rows", str(args.rows),
                   "--tokens", str(args.tokens)]  # fmt: skip
            env = {**os.environ, "LOGPROB_BENCH_DTYPE": args.dtype}
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            result = json.loads(out.strip().splitlines()[-1])
            cells = ", ".join(f"{k} {v:.0f}" for k, v in result.items())
            print(f"{what:<7} {label:<16} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
