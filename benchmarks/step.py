"""Where a training step's time goes: per-phase table and the share outside the real work.

    python benchmarks/step.py                       # quickstart-sized GRPO, 1 worker, 4 steps
    python benchmarks/step.py --config examples/quickstart/grpo.toml --steps 6
    python benchmarks/step.py --algorithm ppo --workers 2

Without ``--config`` it builds the quickstart's model shape (Qwen2, hidden 128, 4 layers, 4
heads, 2 KV heads, tied embeddings; random weights) and synthetic "What is a + b?" prompts in a
temporary folder, then trains with 32 prompts x 8 samples and 24 new tokens. A random model
fills every response to the limit: the heaviest case for generation.

Driver phases (``timing_s/*``) are what the driver waits for; worker phases
(``timing_s/worker/*``, slowest rank) are the compute inside the workers. "Overhead" is the
step time outside generate, forward passes, forward/backward and optimizer steps: reward
scoring, advantages, weight sync, Ray transport and dispatch. Goal: <= 5 % of the step.
The first step (warm-up) is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

COMPUTE = (
    "generate",
    "actor_forward",
    "ref_forward",
    "critic_forward",
    "actor_forward_backward",
    "actor_optimizer",
    "critic_forward_backward",
    "critic_optimizer",
)
DRIVER = (
    "gen",
    "old_log_prob",
    "ref",
    "values",
    "reward",
    "adv",
    "update_critic",
    "update_actor",
    "step",
)


def synthetic_config(root: Path, algorithm: str, workers: int, steps: int) -> str:
    from rlcore.testing.tiny_model import build_tiny_model

    model = build_tiny_model(
        root / "model", hidden=128, layers=4, heads=4, kv_heads=2, tie_word_embeddings=True
    )
    rows = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate((a, b) for a in range(20) for b in range(20))
    ]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    critic = "[critic]\noptim = { lr = 1e-5 }\n" if algorithm == "ppo" else ""
    return f"""
[data]
train_files = ["{data}"]
max_prompt_length = 64
max_response_length = 24
train_batch_size = 32

[model]
path = "{model}"

[actor]
ppo_mini_batch_size = 32
micro_batch_size = {256 // workers}
optim = {{ lr = 1e-4 }}

{critic}
[rollout]
name = "hf"
n = 8
temperature = 1.0

[reward]
default = ["gsm8k"]

[algorithm]
name = "{algorithm}"

[trainer]
total_steps = {steps}
val_before_train = false
test_freq = 0
loggers = ["jsonl"]
run_dir = "{root / "run"}"

[resources]
processes_per_node = {workers}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a run config (default: quickstart-sized synthetic)")
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="measured steps (after 1 warm-up)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = parser.parse_args(argv)

    import ray

    from rlcore.config import load_config, load_config_text
    from rlcore.trainer import run_training
    from rlcore.workers.cluster import start_ray

    total = args.steps + 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        common = [
            f"trainer.total_steps={total}",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            'trainer.loggers=["jsonl"]',
            f'trainer.run_dir="{root / "run"}"',
            f"resources.processes_per_node={args.workers}",
            *args.overrides,
        ]
        if args.config:
            config = load_config(args.config, common)
        else:
            text = synthetic_config(root, args.algorithm, args.workers, total)
            config = load_config_text(text, source="benchmark.toml", overrides=args.overrides)
        start_ray(config.resources)
        run_training(config)
        rows = [json.loads(x) for x in (root / "run" / "metrics.jsonl").read_text().splitlines()]
        ray.shutdown()
    rows = [r for r in rows if r.get("step", 0) > 1]  # leave the warm-up step out

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        return statistics.mean(values) if values else None

    step = mean("timing_s/step") or float("nan")
    print(f"\n{len(rows)} steps measured ({args.workers} worker(s)); mean seconds per step\n")
    print(f"{'driver phase':<28}{'s':>9}{'% step':>9}")
    for name in DRIVER:
        value = mean(f"timing_s/{name}")
        if value is not None:
            print(f"{name:<28}{value:>9.3f}{100 * value / step:>8.1f}%")
    print(f"\n{'worker phase (slowest rank)':<28}{'s':>9}{'% step':>9}")
    compute = 0.0
    for name in (*COMPUTE, "weight_sync"):
        value = mean(f"timing_s/worker/{name}")
        if value is None:
            continue
        if name in COMPUTE:
            compute += value
        print(f"{name:<28}{value:>9.3f}{100 * value / step:>8.1f}%")
    overhead = step - compute
    reward, adv = mean("timing_s/reward") or 0.0, mean("timing_s/adv") or 0.0
    sync = mean("timing_s/worker/weight_sync") or 0.0
    rest = overhead - reward - adv - sync
    share = 100 * overhead / step
    print(f"\n{'outside the real work':<28}{overhead:>9.3f}{share:>8.1f}%  (goal <= 5%)")
    for name, value in (
        ("  reward", reward),
        ("  advantages", adv),
        ("  weight sync", sync),
        ("  transport, dispatch, rest", rest),
    ):
        print(f"{name:<28}{value:>9.3f}{100 * value / step:>8.1f}%")
    tokens = mean("perf/tokens_per_s")
    if tokens is not None:
        print(f"\nthroughput: {tokens:.0f} tokens/s (prompt + response, whole step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
