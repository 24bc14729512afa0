"""The quickstart's seed-0 curve as the READMEs quote it matches a recorded run.

``examples/quickstart/seed0_curve.json`` is written from a real run
(``examples/quickstart/record_curve.py``; no run here). Every quote of today's seed-0 curve
in README.md and examples/quickstart/README.md is marked ``<!-- quickstart-seed0 -->``:
``A% → B% (step S: C%)`` is step 0, the last step and step S. The grpo row of the curve table
in examples/quickstart/README.md is checked column by column. A default that moves the curve
fails here until the file is re-recorded and the quotes follow it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CURVE_FILE = REPO / "examples" / "quickstart" / "seed0_curve.json"
DOCS = (REPO / "README.md", REPO / "examples" / "quickstart" / "README.md")
TABLE_ROW = "| full fine-tuning (`grpo.toml`), seed 0 today |"

MARK = "<!-- quickstart-seed0 -->"
QUOTE = re.compile(
    re.escape(MARK) + r"\**(\d+\.\d)% → (\d+\.\d)%\**(?: \(step (\d+): (\d+\.\d)%\))?"
)


def recorded() -> dict[int, float]:
    data = json.loads(CURVE_FILE.read_text(encoding="utf-8"))
    return {int(step): float(acc) for step, acc in data["curve"].items()}


def quote_mismatches(text: str, curve: dict[int, float], where: str) -> list[str]:
    """Each marked quote that is not the curve's, as ``where: quoted != recorded``."""
    if text.count(MARK) != len(QUOTE.findall(text)):
        return [f"{where}: a {MARK} is not followed by 'A% → B% (step S: C%)'"]
    bad = []
    last = max(curve)
    for start, end, step, at_step in QUOTE.findall(text):
        quoted = {0: float(start), last: float(end)}
        if step:
            quoted[int(step)] = float(at_step)
        for s, value in quoted.items():
            if curve.get(s) != value:
                bad.append(f"{where}: step {s} quoted {value}%, recorded {curve.get(s)}%")
    return bad


def table_mismatches(text: str, curve: dict[int, float], where: str) -> list[str]:
    """The marked table row against the curve, column by column (header: ``| step | 0 | ...``)."""
    lines = text.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith(TABLE_ROW)]
    if len(rows) != 1:
        return [f"{where}: {len(rows)} rows start with {TABLE_ROW!r}, expected 1"]
    header = next(lines[i] for i in range(rows[0], -1, -1) if lines[i].startswith("| step |"))
    steps = [int(c) for c in _cells(header)[1:]]
    values = [float(c) for c in _cells(lines[rows[0]])[1:]]
    return [
        f"{where}: table step {s} quotes {v}%, recorded {curve.get(s)}%"
        for s, v in zip(steps, values, strict=True)
        if curve.get(s) != v
    ]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_recorded_curve_is_a_whole_run():
    curve = recorded()
    assert min(curve) == 0, sorted(curve)
    assert max(curve) == 150, sorted(curve)  # grpo.toml's trainer.total_steps
    assert all(0.0 <= v <= 100.0 for v in curve.values())


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_quoted_seed0_curve_is_the_recorded_one(doc):
    text = doc.read_text(encoding="utf-8")
    assert MARK in text, f"{doc} quotes no marked seed-0 curve"
    curve = recorded()
    bad = quote_mismatches(text, curve, doc.name)
    if doc.name == "README.md" and doc.parent.name == "quickstart":
        bad += table_mismatches(text, curve, doc.name)
    assert not bad, "\n".join(bad)


def test_the_check_fails_on_a_stale_quote_and_a_stale_table():
    curve = {0: 35.5, 10: 53.5, 150: 75.0}
    ok = f"accuracy {MARK}**35.5% → 75.0%** (step 10: 53.5%)"
    assert quote_mismatches(ok, curve, "doc") == []
    stale = f"accuracy {MARK}**35.5% → 77.0%** (step 10: 50.5%)"
    assert quote_mismatches(stale, curve, "doc") == [
        "doc: step 150 quoted 77.0%, recorded 75.0%",
        "doc: step 10 quoted 50.5%, recorded 53.5%",
    ]
    assert quote_mismatches(f"{MARK} 77%", curve, "doc")  # a mark on an unreadable quote
    table = f"| step | 0 | 10 | 150 |\n|---|---:|---:|---:|\n{TABLE_ROW} 35.5 | 50.5 | 75.0 |"
    assert table_mismatches(table, curve, "doc") == [
        "doc: table step 10 quotes 50.5%, recorded 53.5%"
    ]
