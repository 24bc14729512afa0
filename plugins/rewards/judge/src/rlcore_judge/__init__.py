"""A generative judge for rlcore: the ``judge`` batched reward, its template and score parser."""

from __future__ import annotations

from rlcore_judge.parse import (
    DEFAULT_PATTERN,
    DEFAULT_TEMPLATE,
    Judgement,
    ScoreParser,
    check_template,
    render,
)

__all__ = [
    "DEFAULT_PATTERN",
    "DEFAULT_TEMPLATE",
    "Judgement",
    "ScoreParser",
    "check_template",
    "render",
]
