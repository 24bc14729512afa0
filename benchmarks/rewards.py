"""Scoring throughput of the GSM8K and math rewards on the real evaluation files.

    python benchmarks/rewards.py [--repeat 2] [--workers 2]

Each response is the dataset's own reference solution (so every sample takes the scorer's
"correct" path, which for math includes the symbolic check), scored against its ground truth:

- ``scorer``: ``reward.score`` in a plain loop (no decode, no time limit): the floor;
- ``manager, driver``: ``RewardManager`` end to end (decode with a char-level tokenizer,
  SIGALRM limit per call, token-level tensor) with ``num_workers=1``;
- ``manager, pool N``: the same with the process pool forced on, N workers (already started:
  the one-off start-up is reported on its own line).

Then the crossover: for which batch sizes the pool beats the driver, per reward. Prints
samples/s; ratios are against ``manager, driver``.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"


def char_tokenizer(path: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(string.printable)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def gsm8k_samples() -> list[tuple[str, str, str]]:
    rows = [json.loads(x) for x in (DATA / "gsm8k" / "test.jsonl").open()]
    return [
        ("openai/gsm8k", r["answer"], r["answer"].split("####")[-1].strip().replace(",", ""))
        for r in rows
    ]


def math_samples() -> list[tuple[str, str, str]]:
    out = []
    for name in ("math500", "minerva_math", "amc23", "aime24"):
        for line in (DATA / "math" / name / "test.jsonl").open():
            r = json.loads(line)
            answer = r.get("answer")
            solution = r.get("solution") or f"The answer is $\\boxed{{{answer}}}$."
            if answer is None:  # minerva: the reference is the solution's own box
                answer = solution[solution.rfind("\\boxed{") :]
            if isinstance(answer, float) and answer.is_integer():
                answer = int(answer)
            out.append((name, solution, str(answer)))
    return out


def make_batch(tokenizer, samples):
    import torch

    from rlcore.protocol import DataProto

    ids = [tokenizer(s, add_special_tokens=False)["input_ids"] + [1] for _, s, _ in samples]
    R = max(len(x) for x in ids)
    responses = torch.zeros(len(ids), R, dtype=torch.long)
    mask = torch.zeros(len(ids), R, dtype=torch.long)
    for i, x in enumerate(ids):
        responses[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    prompts = torch.ones(len(ids), 4, dtype=torch.long)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": mask,
            "attention_mask": torch.cat([torch.ones_like(prompts), mask], 1),
        },
        non_tensors={
            "data_source": [d for d, _, _ in samples],
            "reward_model": [{"ground_truth": g} for _, _, g in samples],
        },
    )


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    from rlcore.reward import RewardManager

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2, help="best of N timings")
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    args = parser.parse_args()

    from rlcore_gsm8k import GSM8KReward

    rewards = {"gsm8k": GSM8KReward()}
    sets = {"gsm8k": gsm8k_samples() * 4}
    try:
        from rlcore_math.reward import MathReward
    except ImportError:
        sys.path.insert(0, str(REPO / "plugins" / "rewards" / "math" / "src"))
        try:
            from rlcore_math.reward import MathReward
        except ImportError as err:
            print(f"math reward not available ({err}); benchmarking gsm8k only")
            MathReward = None
    if MathReward is not None:
        rewards["math"] = MathReward()
        sets["math"] = math_samples()

    tokenizer = char_tokenizer(Path(tempfile.mkdtemp(prefix="rlcore-bench-tok-")))
    print(f"{'reward':8} {'path':18} {'samples':>8} {'seconds':>8} {'samples/s':>10} {'ratio':>6}")
    crossover_rows = []
    for name, samples in sets.items():
        reward = rewards[name]
        batch = make_batch(tokenizer, samples)
        n = len(samples)

        def scorer_only(reward=reward, samples=samples):
            return [reward.score(d, s, g) for d, s, g in samples]

        results = {}
        results["scorer"] = timed(scorer_only, args.repeat)[0]
        driver = RewardManager(tokenizer, {name: reward}, default=name, num_workers=1)
        results["manager, driver"], (_, metrics) = timed(
            lambda d=driver, b=batch: d(b), args.repeat
        )
        acc = metrics[f"reward/{samples[0][0]}/acc"]
        for w in args.workers:
            pool = RewardManager(
                tokenizer,
                {name: reward},
                default=name,
                num_workers=w,
                pool_min_batch=1,
                pool_min_seconds=0.0,
            )
            pool._seconds_per_task = 1.0  # skip the driver-side probe: all to the pool
            start = time.perf_counter()
            pool(batch[:w])  # starts the workers
            results[f"startup, pool {w}"] = time.perf_counter() - start
            results[f"manager, pool {w}"] = timed(lambda p=pool, b=batch: p(b), args.repeat)[0]
            # Crossover: small batches, driver vs pool.
            for size in (16, 64, 256, 1024):
                if size > n:
                    continue
                small = batch[:size]
                t_driver = timed(lambda d=driver, b=small: d(b), args.repeat)[0]
                t_pool = timed(lambda p=pool, b=small: p(b), args.repeat)[0]
                crossover_rows.append((name, w, size, t_driver, t_pool))
            pool.close()
        base = results["manager, driver"]
        for path, sec in results.items():
            if path.startswith("startup"):
                print(f"{name:8} {path:18} {'':>8} {sec:8.3f}")
                continue
            print(f"{name:8} {path:18} {n:8d} {sec:8.3f} {n / sec:10.0f} {base / sec:6.2f}")
        print(f"{name:8} (accuracy of the reference solutions: {acc:.3f})")

    print()
    head = f"{'reward':8} {'workers':>7} {'batch':>6} {'driver s':>9} {'pool s':>8}"
    print(f"{head} {'driver/pool':>12}")
    for name, w, size, t_driver, t_pool in crossover_rows:
        print(f"{name:8} {w:7d} {size:6d} {t_driver:9.4f} {t_pool:8.4f} {t_driver / t_pool:12.2f}")


if __name__ == "__main__":
    main()
