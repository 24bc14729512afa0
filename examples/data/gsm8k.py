"""Prepare GSM8K as parquet with verl's row schema.

    python examples/data/gsm8k.py [--input-dir ../shared/data/gsm8k] [--output-dir ~/data/gsm8k]

Reads ``train.jsonl`` and ``test.jsonl`` (``question``, ``answer`` = chain of thought then
``#### <number>``) and writes ``train.parquet`` and ``test.parquet``, one row each::

    data_source   "openai/gsm8k"
    prompt        [{"role": "user", "content": question + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": "<the number after ####, no commas>"}
    extra_info    {"split", "index", "answer" (the full solution), "question"}

These are the rows verl's ``examples/data_preprocess/gsm8k.py`` writes, so configs and scores
carry over. A missing file or field is reported in one line (exit code 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

# A script's folder comes first on sys.path, and this folder holds math.py, which would
# shadow the standard library's ``math`` for everything imported below (numpy fails).
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
import re
from typing import Any

from rlcore.data import read_rows
from rlcore.errors import DataError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
REPO = Path(__file__).resolve().parents[2]
DEFAULT_INPUT = REPO / ".." / "shared" / "data" / "gsm8k"
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def ground_truth(solution: str, where: str) -> str:
    """The number after ``####`` with commas removed: ``"... #### 1,000"`` -> ``"1000"``."""
    found = _ANSWER.findall(solution)
    if not found:
        msg = f"{where}: 'answer' has no '#### <number>' final answer"
        raise DataError(msg)
    return found[-1].replace(",", "")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        msg = (
            f"GSM8K file not found: {path} (pass --input-dir, the folder holding "
            f"{' and '.join(s + '.jsonl' for s in SPLITS)})"
        )
        raise DataError(msg)
    rows = read_rows(path)  # one-line DataError for bad JSON, naming file and line
    if not rows:
        msg = f"{path} holds no rows"
        raise DataError(msg)
    return rows


def make_rows(raw: list[dict[str, Any]], split: str, path: Path) -> list[dict[str, Any]]:
    rows = []
    for index, item in enumerate(raw):
        where = f"{path}:{index + 1}"
        for field in ("question", "answer"):
            if not isinstance(item.get(field), str):
                msg = f"{where}: missing string field {field!r} (has: {sorted(item)})"
                raise DataError(msg)
        question, answer = item["question"], item["answer"]
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": ground_truth(answer, where)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": answer,
                    "question": question,
                },
            }
        )
    return rows


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def prepare(input_dir: Path, output_dir: Path) -> dict[str, int]:
    """Write one parquet per split; return the row count of each."""
    # Read every split before writing any, so a bad input leaves no partial output.
    prepared = {}
    for split in SPLITS:
        path = input_dir / f"{split}.jsonl"
        prepared[split] = make_rows(read_jsonl(path), split, path)
    for split, rows in prepared.items():
        write_parquet(rows, output_dir / f"{split}.parquet")
    return {split: len(rows) for split, rows in prepared.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input-dir", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--output-dir", type=Path, default=Path("~/data/gsm8k"))
    args = parser.parse_args(argv)
    output_dir = args.output_dir.expanduser()
    try:
        counts = prepare(args.input_dir.expanduser(), output_dir)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for split, n in counts.items():
        print(f"wrote {n} rows to {output_dir / f'{split}.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
