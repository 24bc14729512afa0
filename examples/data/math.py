"""Prepare the math evaluation sets as parquet with verl's row schema.

    python examples/data/math.py [--dataset all|math500|minerva_math|amc23|aime24]
                                 [--input-dir ../shared/data/math] [--output-dir ~/data/math]

Reads ``<input-dir>/<dataset>/test.jsonl`` and writes ``<output-dir>/<dataset>/test.parquet``::

    data_source   the dataset's name ("math500", "minerva_math", "amc23", "aime24"), the key
                  of [reward.sources]
    prompt        [{"role": "user", "content": problem + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": answer}
    extra_info    {"split": "test", "index", "problem", ...the dataset's own fields}

The ground truth is the ``answer`` field (math500, amc23, aime24; amc23's floats such as
``27.0`` are written ``"27"``), or else the last ``\\boxed{...}`` of ``solution``
(minerva_math). A missing file or field is reported in one line (exit code 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named math.py: when run as a script its folder comes first on sys.path and
# would shadow the standard library's ``math`` for everything imported below.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
from typing import Any

from rlcore.data import read_rows
from rlcore.errors import DataError

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
DATASETS = ("math500", "minerva_math", "amc23", "aime24")
REPO = Path(__file__).resolve().parents[2]
DEFAULT_INPUT = REPO / ".." / "shared" / "data" / "math"
# Fields copied into extra_info when a dataset has them.
EXTRA_FIELDS = ("solution", "subject", "level", "unique_id", "type", "idx", "id", "url")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None  # unbalanced


def answer_text(value: Any) -> str:
    """An answer as text: ``27.0`` -> ``"27"``, ``"204"`` -> ``"204"``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def ground_truth(item: dict[str, Any], where: str) -> str:
    if item.get("answer") is not None:
        return answer_text(item["answer"])
    solution = item.get("solution")
    if not isinstance(solution, str):
        msg = f"{where}: no 'answer' and no 'solution' to take it from (has: {sorted(item)})"
        raise DataError(msg)
    boxed = last_boxed(solution)
    if not boxed:
        msg = f"{where}: no 'answer', and 'solution' has no \\boxed{{...}} answer"
        raise DataError(msg)
    return boxed


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        msg = f"math data file not found: {path} (pass --input-dir, the folder holding " + (
            f"{'/, '.join(DATASETS)}/ each with test.jsonl)"
        )
        raise DataError(msg)
    rows = read_rows(path)  # one-line DataError for bad JSON, naming file and line
    if not rows:
        msg = f"{path} holds no rows"
        raise DataError(msg)
    return rows


def make_rows(raw: list[dict[str, Any]], name: str, path: Path) -> list[dict[str, Any]]:
    rows = []
    for index, item in enumerate(raw):
        where = f"{path}:{index + 1}"
        problem = item.get("problem", item.get("question"))
        if not isinstance(problem, str):
            msg = f"{where}: missing string field 'problem' (has: {sorted(item)})"
            raise DataError(msg)
        extra = {"split": "test", "index": index, "problem": problem}
        # Stringified: parquet needs one type per column, and ids are int in one set, str
        # in another.
        extra.update({k: str(item[k]) for k in EXTRA_FIELDS if item.get(k) is not None})
        rows.append(
            {
                "data_source": name,
                "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": ground_truth(item, where)},
                "extra_info": extra,
            }
        )
    return rows


def prepare(names: list[str], input_dir: Path, output_dir: Path) -> dict[str, int]:
    """Write ``<output_dir>/<name>/test.parquet`` per dataset; return row counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Read every dataset before writing any, so a bad input leaves no partial output.
    prepared = {}
    for name in names:
        path = input_dir / name / "test.jsonl"
        prepared[name] = make_rows(read_jsonl(path), name, path)
    for name, rows in prepared.items():
        (output_dir / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), output_dir / name / "test.parquet")
    return {name: len(rows) for name, rows in prepared.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=("all", *DATASETS), default="all")
    parser.add_argument("--input-dir", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--output-dir", type=Path, default=Path("~/data/math"))
    args = parser.parse_args(argv)
    names = list(DATASETS) if args.dataset == "all" else [args.dataset]
    output_dir = args.output_dir.expanduser()
    try:
        counts = prepare(names, args.input_dir.expanduser(), output_dir)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, n in counts.items():
        print(f"wrote {n} rows to {output_dir / name / 'test.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
