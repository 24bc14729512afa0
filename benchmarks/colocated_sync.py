"""The colocated weight sync on a real model: bytes, sync and step time, two trees side by side.

    python benchmarks/colocated_sync.py --model /tmp/smollm2-hf --before /work/main

Each run is a fresh process (``--ranks`` of them) holding what one colocated policy worker
holds (an FSDP2 actor on gloo and the HF rollout, float32 unless ``--rollout-dtype``) and runs
``--steps`` GRPO-shaped steps: generate ``--prompts`` x ``--n`` samples of ``--new-tokens``
tokens, the old log-probs, one forward/backward and optimizer step, then the weight sync as
the worker runs it (``push_weights``: ``perf/weight_sync_bytes`` is its return, rank 0's).
Runs alternate between the ``--before`` tree and this one (``--repeats`` each), so machine
load hits both alike; the table shows medians over steps after the first of each run, and
rank 0's peak RSS.
Wall clock on whatever else the machine runs: compare the two rows, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _tree_path(tree: Path) -> str:
    """PYTHONPATH that imports ``tree``'s core and plugins (as /work/wt/env.sh builds it)."""
    parts = [tree / "core" / "src", *sorted((tree / "plugins").glob("*/*/src"))]
    return os.pathsep.join(str(p) for p in parts)


def _worker(args: argparse.Namespace) -> None:
    """One run: print one JSON line per step."""
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
    from rlcore.protocol import DataProto
    from rlcore.testing.prompts import prompt_batch
    try:
        from rlcore.workers.weight_push import push_weights
    except ImportError:  # a tree from before the copy-free sync (c9d327e) kept it in roles
        from rlcore.trainer.roles import push_weights
    from rlcore_fsdp2.engine import FSDP2Engine
    from rlcore_hf.rollout import HFRollout

    def peak_rss_gb() -> float:  # rlcore.tracking.metrics.peak_rss_gb, absent before
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)

    torch.set_num_threads(1)
    if "RANK" in os.environ:  # --ranks N: FSDP2 shards over N gloo ranks, each one rollout
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tok = AutoTokenizer.from_pretrained(args.model)
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for a, b in zip(range(11, 99, 7), range(23, 99, 9), strict=False)
    ][: args.prompts]
    prompts = prompt_batch(tok, texts).repeat(args.n, interleave=True)
    spec = EngineSpec(
        role="actor", model_path=args.model, optim=OptimConfig(lr=1e-6), micro_batch_size=8
    )
    actor = FSDP2Engine(spec, FSDP2Engine.Config())
    rollout = HFRollout(RolloutSpec(model_path=args.model, dtype=args.rollout_dtype))
    push_weights(actor, rollout)  # what init_model does
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    g = torch.Generator().manual_seed(0)

    def loss_fn(outputs, mb, totals):  # type: ignore[no-untyped-def]
        m = mb.batch["response_mask"].float()
        ratio = torch.exp(outputs.log_probs - mb.batch["old_log_probs"])
        return -(ratio * mb.batch["advantages"] * m).sum() / totals.tokens, {}

    for step in range(args.steps):
        start = time.perf_counter()
        gen = rollout.generate(prompts, sampling)
        t_gen = time.perf_counter() - start
        old = actor.compute_log_prob(gen, temperature=1.0).log_probs
        adv = torch.randn(len(gen), 1, generator=g).expand(-1, args.new_tokens)
        batch = gen.union(
            DataProto.from_dict(tensors={"advantages": adv.contiguous(), "old_log_probs": old})
        )
        actor.forward_backward(batch, loss_fn, temperature=1.0)
        actor.optimizer_step(lr=1e-6)
        t_sync = time.perf_counter()
        sent = push_weights(actor, rollout)
        t_end = time.perf_counter()
        row = {
            "step": step,
            "sync_bytes": sent,
            "sync_s": t_end - t_sync,
            "gen_s": t_gen,
            "step_s": t_end - start,
            "peak_rss_gb": peak_rss_gb(),
        }
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def _run(tree: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": _tree_path(tree), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", args.model]
    for name in ("steps", "prompts", "n", "new_tokens", "rollout_dtype"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.ranks == 1:
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=1800, check=False, cwd=tree
        )
        if proc.returncode != 0:
            sys.exit(f"run in {tree} failed:\n{proc.stderr[-3000:]}")
        out = proc.stdout
    else:
        from rlcore.testing.ranks import Ranks

        with Ranks(argv, world_size=args.ranks, env=env) as ranks:
            out = ranks.wait(timeout=1800)[0]
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--before", type=Path, help="the tree to compare with (e.g. main)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--rollout-dtype", default="float32")
    parser.add_argument("--ranks", type=int, default=1, help="FSDP2 ranks (gloo processes)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    trees = {"before": args.before, "after": HERE} if args.before else {"after": HERE}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    peaks: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            run = _run(tree, args)
            print(f"{name}: {json.dumps(run)}", file=sys.stderr, flush=True)  # progress
            rows[name] += run[1:]  # the first step of a run warms up
            peaks[name].append(run[-1]["peak_rss_gb"])
    print(
        f"{args.ranks} rank(s), each {args.prompts} prompts x {args.n}, {args.new_tokens} "
        f"tokens, rollout "
        f"{args.rollout_dtype}, {args.repeats} runs x {args.steps - 1} steps each (medians)"
    )
    head = ("tree", "weight_sync_bytes", "sync_s", "gen_s", "step_s", "peak_rss_gb")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, got in rows.items():
        med = {
            k: statistics.median(r[k] for r in got)
            for k in ("sync_bytes", "sync_s", "gen_s", "step_s")
        }
        print(
            f"| {name} | {med['sync_bytes']:,.0f} | {med['sync_s']:.2f} | {med['gen_s']:.2f} "
            f"| {med['step_s']:.2f} | {max(peaks[name]):.2f} |"
        )


if __name__ == "__main__":
    main()
