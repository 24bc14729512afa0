"""One greedy validation pass of the HF rollout on a real chat model, two trees side by side.

    python benchmarks/validation_pass.py --model /tmp/smollm2-hf --before /work/main

``--prompts`` distinct "What is a + b? Answer with just the number." prompts in the model's
chat template (SmolLM2's adds its default system prompt), one greedy ``generate`` of
``--new-tokens`` tokens over all of them, as the trainer's validation does on one worker.
Runs alternate between the ``--before`` tree and this one (``--repeats`` each); prints the
seconds of each and whether the responses are the same. Wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _tree_path(tree: Path) -> str:
    parts = [tree / "core" / "src", *sorted((tree / "plugins").glob("*/*/src"))]
    return os.pathsep.join(str(p) for p in parts)


def _worker(args: argparse.Namespace) -> None:
    import random

    import torch
    from transformers import AutoTokenizer

    from rlcore.interfaces import RolloutSpec, SamplingParams
    from rlcore.testing.prompts import prompt_batch
    from rlcore_hf.rollout import HFRollout

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    rng = random.Random(0)
    texts = [
        tok.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? "
                    "Answer with just the number.",
                }
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for _ in range(args.prompts)
    ]
    prompts = prompt_batch(tok, texts)
    rollout = HFRollout(RolloutSpec(model_path=args.model))
    start = time.perf_counter()
    out = rollout.generate(prompts, SamplingParams(max_new_tokens=args.new_tokens, do_sample=False))
    seconds = time.perf_counter() - start
    print(json.dumps({"s": seconds, "responses": out.batch["responses"].tolist()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--before", type=Path)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    trees = {"before": args.before, "after": HERE} if args.before else {"after": HERE}
    got: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            argv = [sys.executable, str(Path(__file__).resolve()), "--worker"]
            argv += ["--model", args.model, "--prompts", str(args.prompts)]
            argv += ["--new-tokens", str(args.new_tokens)]
            env = {**os.environ, "PYTHONPATH": _tree_path(tree), "OMP_NUM_THREADS": "1"}
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=3600, check=False
            )
            if proc.returncode != 0:
                sys.exit(f"run in {tree} failed:\n{proc.stderr[-3000:]}")
            got[name].append(json.loads(proc.stdout.splitlines()[-1]))
            print(f"{name}: {got[name][-1]['s']:.1f} s", file=sys.stderr, flush=True)
    print(f"{args.prompts} prompts, greedy, {args.new_tokens} tokens, one core")
    print("| tree | seconds (each run) | same responses as the first tree |\n|---|---|---|")
    first = next(iter(got.values()))[0]["responses"]
    for name, runs in got.items():
        same = all(r["responses"] == first for r in runs)
        seconds = ", ".join(f"{r['s']:.1f}" for r in runs)
        print(f"| {name} | {seconds} | {same} |")


if __name__ == "__main__":
    main()
