"""Prepare GSM8K as parquet with verl's row schema.

    python examples/data/gsm8k.py [--input-dir ../shared/data/gsm8k] [--output-dir ~/data/gsm8k]

Reads each split from ``train.jsonl`` / ``test.jsonl`` (the release's files) or, where those
are absent, from Hugging Face's parquet files (``train.parquet``, ``train-00000-of-00001.parquet``
or the same under ``main/``, as ``openai/gsm8k`` ships them): rows with ``question`` and
``answer`` (chain of thought, then ``#### <number>``). Writes ``train.parquet`` and
``test.parquet`` in ``--output-dir``, one row each::

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


def split_file(input_dir: Path, split: str) -> Path:
    """The file holding ``split``: its ``.jsonl``, else one of Hugging Face's parquet names."""
    candidates = [
        input_dir / f"{split}.jsonl",
        input_dir / f"{split}.parquet",
        input_dir / f"{split}-00000-of-00001.parquet",
        input_dir / "main" / f"{split}-00000-of-00001.parquet",
    ]
    for path in candidates:
        if path.is_file():
            return path
    msg = (
        f"GSM8K file not found: {candidates[0]} (pass --input-dir, the folder holding "
        f"{' and '.join(s + '.jsonl' for s in SPLITS)}, or their parquet files)"
    )
    raise DataError(msg)


def read_split(path: Path) -> list[dict[str, Any]]:
    rows = read_rows(path)  # one-line DataError for bad JSON or parquet, naming the file
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
        path = split_file(input_dir, split)
        prepared[split] = make_rows(read_split(path), split, path)
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
