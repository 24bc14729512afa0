"""The judge's prompt template and score parser: pure functions, no torch.

:func:`check_template` is what the config runs on ``template`` (one line naming what is wrong);
:func:`render` fills it. :class:`ScoreParser` reads a score from a judgement and never raises:
whatever the judge wrote (no number, ``NaN``, ``1e999``, a 10,000-digit number, a number out
of the declared scale, binary junk), the outcome is a :class:`Judgement` whose ``status``
says how it was read, and an unparseable one scores ``unparseable_score``.

Numbers are ASCII digits only: every pattern is compiled with the ASCII flag, so ``\\d`` is
``[0-9]`` (``float("٧")`` is 7.0: a judge writing Arabic-Indic digits would otherwise score).
Patterns are compiled by the ``regex`` package, whose matching takes a timeout: a user pattern
that backtracks without bound (``(a+)+$``) costs at most :data:`PARSE_TIMEOUT_S` per
judgement, which then counts as unparseable.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence
from typing import Any, Literal

import attrs
import regex as re  # the stdlib's API, plus a timeout on matching

__all__ = [
    "DEFAULT_PATTERN",
    "DEFAULT_TEMPLATE",
    "PARSE_TIMEOUT_S",
    "PLACEHOLDERS",
    "Judgement",
    "ScoreParser",
    "check_pattern",
    "check_template",
    "render",
    "template_fields",
]

#: What a template may name; ``{response}`` is required.
PLACEHOLDERS: tuple[str, ...] = ("prompt", "response", "ground_truth")

#: A rating in double brackets, ``[[7]]`` or ``[[ 8.5 ]]`` (MT-Bench's judge format).
DEFAULT_PATTERN = r"\[\[\s*([-+]?\d+(?:\.\d+)?)\s*\]\]"

DEFAULT_TEMPLATE = """You are grading an answer to a question.

Question:
{prompt}

Reference answer: {ground_truth}

Answer to grade:
{response}

Rate the answer from 0 to 10, where 10 means fully correct. \
Reply with the rating in double brackets, like [[7]]."""

# A plain decimal number, the only text a captured group may hold: no "nan", "inf",
# "1_000" (Python's float() takes all three), hex or words.
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", re.ASCII)
# The last number of a text (the "final number" fallback).
_LAST_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)", re.ASCII)
# Only the tail of a judgement is searched: bounded time on a runaway output.
_MAX_CHARS = 20_000
_MAX_DIGITS = 64  # a longer number is junk (and float() of 10^5 digits is slow)
#: Wall-clock bound of one judgement's matching; past it the judgement is unparseable.
PARSE_TIMEOUT_S = 0.2

Status = Literal["ok", "unparseable", "out_of_range"]


def template_fields(template: str) -> list[str]:
    """The placeholder names of ``template``, in order (``str.format`` syntax); a
    :class:`ValueError` says what is malformed (a lone brace, a positional ``{}``, a name
    not in :data:`PLACEHOLDERS`, a nested field)."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        msg = f"is not a valid template ({err}); write a literal brace as {{{{ or }}}}"
        raise ValueError(msg) from None
    allowed = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    for _, field, spec, _ in parsed:
        if field is None:
            continue
        if field == "" or field.isdigit():
            msg = f"has a positional placeholder {{{field}}}; name one of {allowed}"
            raise ValueError(msg)
        if field not in PLACEHOLDERS:
            msg = (
                f"has an unknown placeholder {{{field}}}; the placeholders are {allowed} "
                "(write a literal brace as {{ or }})"
            )
            raise ValueError(msg)
        if spec and "{" in spec:
            msg = f"has a nested placeholder in {{{field}:{spec}}}; use the plain {{{field}}}"
            raise ValueError(msg)
        names.append(field)
    return names


def check_template(template: str) -> None:
    """A :class:`ValueError` unless ``template`` is well-formed and holds ``{response}``."""
    if "response" not in template_fields(template):
        msg = (
            "has no {response} placeholder, so the judge would not see the answer it scores; "
            "add {response} (placeholders: {prompt}, {response}, {ground_truth})"
        )
        raise ValueError(msg)


def render(template: str, *, prompt: str, response: str, ground_truth: Any) -> str:
    """``template`` filled in (a ground truth that is not text is written with ``str``)."""
    truth = "" if ground_truth is None else str(ground_truth)
    return template.format(prompt=prompt, response=response, ground_truth=truth)


def check_pattern(pattern: str) -> None:
    """A :class:`ValueError` unless ``pattern`` compiles with at most one capture group."""
    try:
        compiled = re.compile(pattern, re.ASCII)
    except re.error as err:
        msg = f"is not a valid regular expression ({err})"
        raise ValueError(msg) from None
    if compiled.groups > 1:
        msg = (
            f"has {compiled.groups} capture groups; give one around the number (or none: "
            "the whole match is the number)"
        )
        raise ValueError(msg)


@attrs.frozen
class Judgement:
    """One judgement read: ``score`` (in [0, 1], or the unparseable score), ``raw`` (the
    number found, None when none) and ``status``."""

    score: float
    raw: float | None
    status: Status

    @property
    def parsed(self) -> bool:
        return self.status == "ok"


class ScoreParser:
    """Reads a number from a judgement and maps it onto [0, 1] by the declared ``scale``.

    ``pattern``: a regular expression whose last match in the text holds the score (its one
    capture group, else the whole match); ``last_number``: when the pattern does not match,
    take the text's final number instead. ``scale = (lo, hi)``: a number ``x`` in it scores
    ``(x - lo) / (hi - lo)``; outside it, ``out_of_range = "unparseable"`` (the judge broke
    the format) or ``"clamp"``. Unparseable judgements score ``unparseable_score``.
    """

    def __init__(
        self,
        pattern: str = DEFAULT_PATTERN,
        *,
        last_number: bool = False,
        scale: Sequence[float] = (0.0, 10.0),
        out_of_range: Literal["unparseable", "clamp"] = "unparseable",
        unparseable_score: float = 0.0,
    ) -> None:
        check_pattern(pattern)
        lo, hi = (float(x) for x in scale)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            msg = f"scale must be two finite numbers, low < high; got {list(scale)}"
            raise ValueError(msg)
        if not math.isfinite(unparseable_score):
            msg = f"unparseable_score must be finite, got {unparseable_score}"
            raise ValueError(msg)
        self.pattern = re.compile(pattern, re.ASCII)
        self.last_number = last_number
        self.lo, self.hi = lo, hi
        self.out_of_range = out_of_range
        self.unparseable_score = float(unparseable_score)

    def __call__(self, text: Any) -> Judgement:
        try:
            return self._parse(text)
        except Exception:  # never raise on a judge's output: it is one unparseable row
            return Judgement(score=self.unparseable_score, raw=None, status="unparseable")

    def _number(self, text: str) -> str | None:
        found = None
        # One deadline for the whole search (TimeoutError past it: unparseable).
        for match in self.pattern.finditer(text, timeout=PARSE_TIMEOUT_S):  # the last one
            found = match
        if found is not None:
            return found.group(1) if self.pattern.groups else found.group(0)
        if self.last_number:
            numbers = _LAST_NUMBER.findall(text)
            return numbers[-1] if numbers else None
        return None

    def _parse(self, text: Any) -> Judgement:
        bad = Judgement(score=self.unparseable_score, raw=None, status="unparseable")
        if not isinstance(text, str):
            return bad
        token = self._number(text[-_MAX_CHARS:])
        if token is None:
            return bad
        token = token.strip()
        if len(token) > _MAX_DIGITS or not _NUMBER.fullmatch(token):
            return bad
        value = float(token)
        if not math.isfinite(value):
            return bad
        if not self.lo <= value <= self.hi and self.out_of_range == "unparseable":
            return Judgement(score=self.unparseable_score, raw=value, status="out_of_range")
        clamped = min(max(value, self.lo), self.hi)
        score = (clamped - self.lo) / (self.hi - self.lo)
        return Judgement(score=score, raw=value, status="ok")
