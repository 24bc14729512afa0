"""Data for the SmolLM2 recipe: two-digit sums the base model partly solves, and GSM8K's test set.

    python examples/smollm2/prepare.py [--work-dir examples/smollm2/work]

Writes under ``--work-dir`` (git-ignored):
  data/train.parquet   "What is a + b? Answer with just the number." for a, b in 1..50, minus
                       the held-out pairs (verl's row schema, data_source "smollm2/sums")
  data/test.parquet    200 held-out pairs: what GRPO validates on (greedy)
  data/train_shuffled.parquet  the control: train.parquet with its answers permuted across
                       rows, so the reward no longer says which sum is right (run.sh --control)
  gsm8k/test.parquet   GSM8K's 1,319 test problems from ../shared/data/gsm8k, as
                       examples/data/gsm8k.py writes them (only for evaluate.py)

Why these sums and not GSM8K itself: greedy SmolLM2-135M-Instruct (Q4_1) solves 29 % of the
200 held-out sums (23 % of another 100), 7.5 % of 200 with a, b in 10..99 and 3 % with 3-digit
numbers (no signal, ../shared/notes/real-model.md), but no GSM8K problem of the first 100
(README.md): GSM8K gives GRPO groups that are all wrong, and 1..50 puts the base model inside
the 10-50 % band that learns. The reward is GSM8K's rule with ``method = "flexible"``: the
last number of the answer, the format the prompt asks for.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA_SOURCE = "smollm2/sums"
DATA_SEED = 0  # the split never depends on the training seed
N_HELD_OUT = 200
LOW, HIGH = 1, 50


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}? Answer with just the number."


def split_pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """All (a, b) with a, b in LOW..HIGH, shuffled once, as (train, test)."""
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]
    random.Random(DATA_SEED).shuffle(pairs)
    return pairs[N_HELD_OUT:], pairs[:N_HELD_OUT]


def make_rows(pairs: list[tuple[int, int]], split: str) -> list[dict]:
    """verl's schema, as the quickstart's rows: chat prompt, ground truth under reward_model."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question(a, b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i},
        }
        for i, (a, b) in enumerate(pairs)
    ]


def shuffled_answers(rows: list[dict]) -> list[dict]:
    """The shuffled-reward control: each prompt scored against another prompt's sum.

    The rewards keep their distribution (a sampled answer still sometimes matches), but no
    longer say which answer is right: a gain under this reward is not the reward's doing.
    """
    answers = [row["reward_model"]["ground_truth"] for row in rows]
    random.Random(DATA_SEED + 1).shuffle(answers)
    return [
        {**row, "reward_model": {**row["reward_model"], "ground_truth": answer}}
        for row, answer in zip(rows, answers, strict=True)
    ]


def _gsm8k_tooling():
    """examples/data/gsm8k.py, loaded by path (its folder's math.py would shadow ``math``)."""
    spec = importlib.util.spec_from_file_location("gsm8k_data", REPO / "examples/data/gsm8k.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=HERE / "work")
    parser.add_argument("--gsm8k-dir", type=Path, default=REPO.parent / "shared" / "data" / "gsm8k")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = args.work_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    train, test = split_pairs()
    for name, pairs in (("train", train), ("test", test)):
        pq.write_table(pa.Table.from_pylist(make_rows(pairs, name)), data / f"{name}.parquet")
    control = shuffled_answers(make_rows(train, "train"))
    pq.write_table(pa.Table.from_pylist(control), data / "train_shuffled.parquet")
    print(
        f"wrote {data}/train.parquet ({len(train)} sums), test.parquet ({len(test)}), "
        "train_shuffled.parquet (the control's permuted answers)"
    )
    if (args.gsm8k_dir / "test.jsonl").is_file() or (args.gsm8k_dir / "test.parquet").is_file():
        gsm8k = _gsm8k_tooling()
        path = gsm8k.split_file(args.gsm8k_dir, "test")
        rows = gsm8k.make_rows(gsm8k.read_split(path), "test", path)
        (args.work_dir / "gsm8k").mkdir(parents=True, exist_ok=True)
        gsm8k.write_parquet(rows, args.work_dir / "gsm8k" / "test.parquet")
        print(f"wrote {args.work_dir}/gsm8k/test.parquet ({len(rows)} GSM8K test problems)")
    else:
        print(f"no GSM8K test file in {args.gsm8k_dir}: skipped (evaluate.py --data needs it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
