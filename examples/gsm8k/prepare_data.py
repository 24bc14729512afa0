"""Convert GSM8K (the raw ``question``/``answer`` jsonl) into rlcore's prompt parquet files.

    python examples/gsm8k/prepare_data.py                       # from ../shared/data/gsm8k
    python examples/gsm8k/prepare_data.py --input-dir DIR --output-dir examples/gsm8k/data

DIR holds ``train.jsonl`` and ``test.jsonl`` as published by openai/grade-school-math
(also the Hugging Face ``openai/gsm8k`` "main" config, exported to jsonl). The rows follow
verl's ``examples/data_preprocess/gsm8k.py``, so its data and ours are interchangeable.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(answer: str) -> str:
    """The number after ``####`` in a GSM8K answer, without thousands separators."""
    found = _FINAL.search(answer)
    if found is None:
        msg = f"GSM8K answer without a '#### <number>' line: {answer[-80:]!r}"
        raise ValueError(msg)
    return found.group(1).replace(",", "")


def convert(row: dict, split: str, index: int) -> dict:
    question = row["question"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_solution(row["answer"])},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": row["answer"],
            "question": question,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-dir", type=Path, default=REPO.parent / "shared" / "data" / "gsm8k")
    parser.add_argument("--output-dir", type=Path, default=REPO / "examples" / "gsm8k" / "data")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq

    args.output_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        src = args.input_dir / f"{split}.jsonl"
        if not src.is_file():
            print(f"error: {src} not found (pass --input-dir)", file=sys.stderr)
            return 2
        with src.open(encoding="utf-8") as fh:
            rows = [
                convert(json.loads(line), split, i) for i, line in enumerate(fh) if line.strip()
            ]
        out = args.output_dir / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), out)
        print(f"wrote {len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
