"""Accuracy and false-positive rate of the reward on reference solutions of real data sets.

Used by ``benchmarks/math_reward_accuracy.py`` (all data sets, a table) and by the tests
(MATH-500 thresholds). Each data set gives (response, answer) pairs:

- ``math500``: the reference ``solution`` against its ``answer``;
- ``minerva_math``: the ``solution`` against the boxed answer of that same solution (the
  data set has no separate answer field, so this checks extraction and self-consistency);
- ``aime24``: the AoPS ``solution`` against the zero-padded ``answer`` ("025");
- ``amc23``: no solutions; the response is ``The answer is $\\boxed{27.0}$`` built from the
  float ``answer``, scored against that float.

Checks, each over every row:

- ``self``: the response against its own answer (accuracy);
- ``shifted`` false positives: each response against the answer of another row (a seeded
  derangement), skipping pairs whose answers are truly equal (equal normalised strings or
  numbers);
- ``changed-digit`` false positives: the answer with one digit changed (seeded position and
  digit), boxed, against the answer. Pairs known to be truly equal after the change (e.g. a
  digit multiplied by 0) are listed in :data:`TRULY_EQUAL_CHANGED` and left out;
- rewrites: the answer rewritten in an equivalent form (:data:`REWRITES`), boxed, against the
  answer; each kind's acceptance rate (the rows it applies to).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from rlcore_math.extract import last_boxed_only_string, remove_boxed
from rlcore_math.reward import MathReward
from rlcore_math.verify import check_equiv

__all__ = [
    "DATASETS",
    "REWRITES",
    "TRULY_EQUAL_CHANGED",
    "AccuracyReport",
    "change_one_digit",
    "evaluate",
    "load_pairs",
]

DATASETS = ("math500", "minerva_math", "amc23", "aime24")


@attrs.frozen(kw_only=True)
class Pair:
    response: str
    answer: Any  # as stored (str, or float for amc23)


@attrs.frozen(kw_only=True)
class AccuracyReport:
    dataset: str
    n: int
    correct: int
    fp_pairs: int  # shuffled pairs compared (truly-equal pairs excluded)
    false_positives: int
    excluded_equal: int
    failures: list[tuple[int, str, str, str]]  # (row, pred, answer, reason)
    fp_examples: list[tuple[int, str, str]]  # (row, pred, other answer)
    excluded_pairs: list[tuple[int, str, str]] = attrs.field(factory=list)  # truly equal
    changed_pairs: int = 0  # answers with a digit to change (truly-equal ones excluded)
    changed_false_positives: list[tuple[int, str, str]] = attrs.field(factory=list)
    changed_excluded: list[tuple[int, str, str]] = attrs.field(factory=list)
    # kind -> (rows it applies to, accepted, examples of rejected (row, rewritten, answer))
    rewrites: dict[str, tuple[int, int, list[tuple[int, str, str]]]] = attrs.field(factory=dict)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.n, 1)

    @property
    def fp_rate(self) -> float:
        return self.false_positives / max(self.fp_pairs, 1)


def load_pairs(dataset: str, data_dir: Path) -> list[Pair]:
    """The (response, answer) pairs of one data set under ``data_dir/math/NAME/test.jsonl``."""
    path = data_dir / "math" / dataset / "test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    pairs = []
    for row in rows:
        if dataset == "minerva_math":
            boxed = last_boxed_only_string(row["solution"])
            answer = remove_boxed(boxed) if boxed is not None else ""
            pairs.append(Pair(response=row["solution"], answer=answer))
        elif dataset == "amc23":
            pairs.append(
                Pair(response=f"The answer is $\\boxed{{{row['answer']}}}$.", answer=row["answer"])
            )
        else:
            pairs.append(Pair(response=row["solution"], answer=row["answer"]))
    return pairs


def change_one_digit(answer: str, row: int, seed: int = 0) -> str | None:
    """``answer`` with one digit replaced by another (seeded by ``row``), or None if no digit."""
    positions = [k for k, ch in enumerate(answer) if ch.isdigit()]
    if not positions:
        return None
    rng = random.Random(seed * 1_000_003 + row)
    k = rng.choice(positions)
    digit = rng.choice([d for d in "0123456789" if d != answer[k]])
    return answer[:k] + digit + answer[k + 1 :]


# (dataset, row, changed answer): changes that leave the answer's value equal, checked by
# hand. Filled from the benchmark's output; each names why.
TRULY_EQUAL_CHANGED: dict[tuple[str, int, str], str] = {}

_FRAC_RE = re.compile(r"^(-?)\\frac\{(\d+)\}\{(\d+)\}$")


def _as_decimal(answer: str) -> str | None:
    # \frac{3}{8} -> 0.375 when the decimal terminates (within 6 places).
    m = _FRAC_RE.match(answer.strip())
    if not m or int(m.group(3)) == 0:
        return None
    num, den = int(m.group(2)), int(m.group(3))
    for places in range(7):
        if (num * 10**places) % den == 0:
            value = num * 10**places // den
            text = str(value).rjust(places + 1, "0")
            return m.group(1) + (text[:-places] + "." + text[-places:] if places else text)
    return None


def _paren(answer: str) -> str | None:
    if "(" not in answer or "\\left" in answer:
        return None
    return answer.replace("(", "\\left(").replace(")", "\\right)")


#: Equivalent rewrites of an answer: kind -> function (None where it does not apply).
REWRITES: dict[str, Callable[[str], str | None]] = {
    "text": lambda a: f"\\text{{{a}}}" if "\\text" not in a else None,
    "dfrac": lambda a: a.replace("\\frac", "\\dfrac") if "\\frac" in a else None,
    "x=": lambda a: f"x = {a}" if "=" not in a and "," not in a else None,
    "no-spaces": lambda a: a.replace(" ", "") if " " in a else None,
    "comma-space": lambda a: a.replace(",", ", ") if "," in a else None,
    "left-right": _paren,
    "decimal": _as_decimal,
    "unbraced-box": lambda a: a if "$" not in a and "\n" not in a else None,
}


def _boxed(answer: str, kind: str = "") -> str:
    if kind == "unbraced-box":
        return f"The answer is $\\boxed {answer}$."
    return f"The answer is $\\boxed{{{answer}}}$."


def _derangement(n: int, seed: int) -> list[int]:
    # A random cycle: row order[i] is paired with the answer of row order[i+1], never itself.
    order = list(range(n))
    random.Random(seed).shuffle(order)
    other = [0] * n
    for i in range(n):
        other[order[i]] = order[(i + 1) % n]
    return other


def evaluate(
    dataset: str, pairs: Iterable[Pair], reward: MathReward | None = None, seed: int = 0
) -> AccuracyReport:
    """Score every pair and its deranged counterpart with ``reward``."""
    reward = reward if reward is not None else MathReward(MathReward.Config())
    pairs = list(pairs)
    failures: list[tuple[int, str, str, str]] = []
    correct = 0
    for i, pair in enumerate(pairs):
        out = reward.score(dataset, pair.response, pair.answer)
        if out["acc"]:
            correct += 1
            continue
        pred = out["pred"]
        if pred is None:
            reason = "no answer extracted"
        else:
            reason = "judged different: " + check_equiv(pred, str(pair.answer))[1]
        failures.append((i, str(pred), str(pair.answer), reason))
    fp = compared = excluded = 0
    fp_examples: list[tuple[int, str, str]] = []
    excluded_pairs: list[tuple[int, str, str]] = []
    for i, j in enumerate(_derangement(len(pairs), seed)):
        a_i, a_j = str(pairs[i].answer), str(pairs[j].answer)
        if check_equiv(a_i, a_j, use_math_verify=False)[0]:
            excluded += 1
            excluded_pairs.append((i, a_i, a_j))
            continue
        compared += 1
        out = reward.score(dataset, pairs[i].response, pairs[j].answer)
        if out["acc"]:
            fp += 1
            fp_examples.append((i, str(out["pred"]), a_j))
    changed_pairs = 0
    changed_fp: list[tuple[int, str, str]] = []
    changed_excluded: list[tuple[int, str, str]] = []
    for i, pair in enumerate(pairs):
        answer = str(pair.answer)
        changed = change_one_digit(answer, i, seed)
        if changed is None:
            continue
        if (dataset, i, changed) in TRULY_EQUAL_CHANGED:
            changed_excluded.append((i, changed, answer))
            continue
        changed_pairs += 1
        if reward.score(dataset, _boxed(changed), pair.answer)["acc"]:
            changed_fp.append((i, changed, answer))
    rewrites: dict[str, tuple[int, int, list[tuple[int, str, str]]]] = {}
    for kind, rewrite in REWRITES.items():
        applies = accepted = 0
        rejected: list[tuple[int, str, str]] = []
        for i, pair in enumerate(pairs):
            answer = str(pair.answer)
            new = rewrite(answer)
            if new is None or (new == answer and kind != "unbraced-box"):
                continue
            applies += 1
            if reward.score(dataset, _boxed(new, kind), pair.answer)["acc"]:
                accepted += 1
            else:
                rejected.append((i, new, answer))
        rewrites[kind] = (applies, accepted, rejected)
    return AccuracyReport(
        dataset=dataset,
        changed_pairs=changed_pairs,
        changed_false_positives=changed_fp,
        changed_excluded=changed_excluded,
        rewrites=rewrites,
        n=len(pairs),
        correct=correct,
        fp_pairs=compared,
        false_positives=fp,
        excluded_equal=excluded,
        excluded_pairs=excluded_pairs,
        failures=failures,
        fp_examples=fp_examples,
    )
