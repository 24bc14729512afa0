"""Find the final answer in a model response: the last ``\\boxed{}`` or a Minerva ``Answer:``.

Everything here is linear in the length of the response (``str.rfind`` plus one scan), so a
100 kB response or ten thousand unbalanced braces cost microseconds, never a regex blow-up.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "ExtractMode",
    "extract_answer",
    "last_boxed_only_string",
    "remove_boxed",
]

ExtractMode = Literal["boxed", "answer", "both"]

# Forms recognised, as in Hendrycks' MATH grader: ``\boxed{..}``, ``\boxed 5`` and ``\fbox{..}``.
_BOXED_OPENERS = ("\\boxed", "\\fbox")

# Minerva's few-shot format ends "Final Answer: The final answer is $X$. I hope it is correct."
# Only the tail of a response is searched, so these regexes see bounded input.
_ANSWER_TAIL_CHARS = 4000
_MINERVA_RE = re.compile(
    r"final answer is\s*(.{1,1000}?)\s*\.?\s*I hope it is correct", re.IGNORECASE | re.DOTALL
)
_ANSWER_LINE_RE = re.compile(
    r"(?:final\s+answer|answer)\s*(?:is)?\s*[:：]\s*([^\n]{1,1000})",
    re.IGNORECASE,
)
_FINAL_ANSWER_IS_RE = re.compile(r"final answer is\s*([^\n]{1,1000})", re.IGNORECASE)


def _match_braces(text: str, open_idx: int) -> int:
    """Index just past the ``}`` closing the ``{`` at ``open_idx``, or -1 if unbalanced."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            # ``\{`` and ``\}`` are literal braces inside the answer, not grouping.
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\boxed x``, ``\\fbox{...}``) in ``text``, or None.

    Braces must balance: a response cut off inside its last box has no answer (an earlier
    box is an intermediate result, not the answer). Returns the whole command, e.g.
    ``"\\boxed{\\frac{1}{2}}"``; :func:`remove_boxed` takes the content out.
    """
    start = max(text.rfind(opener) for opener in _BOXED_OPENERS)
    if start < 0:
        return None
    name_end = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    rest = text[name_end:]
    stripped = rest.lstrip(" ")
    if stripped.startswith("{"):
        open_idx = name_end + (len(rest) - len(stripped))
        end = _match_braces(text, open_idx)
        if end < 0:
            return None
        return text[start:end]
    if rest.startswith(" ") and stripped:
        # ``\boxed 5`` (no braces): the answer runs to the closing ``$`` or end of line;
        # an escaped ``\$`` (``\boxed \$36``) is part of the answer, not its end.
        value = _UNBRACED_END_RE.split(stripped, maxsplit=1)[0].strip()
        return "\\boxed " + value if value else None
    return None


_UNBRACED_END_RE = re.compile(r"(?<!\\)\$|\n")


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` / ``\\boxed x`` / ``\\fbox{x}`` -> ``x`` (unchanged if not boxed)."""
    s = boxed.strip()
    for opener in _BOXED_OPENERS:
        if s.startswith(opener + " ") and not s[len(opener) :].lstrip(" ").startswith("{"):
            return s[len(opener) + 1 :].strip()
        if s.startswith(opener):
            inner = s[len(opener) :].lstrip(" ")
            if inner.startswith("{") and inner.endswith("}"):
                return inner[1:-1]
    return s


def _clean_answer_text(ans: str) -> str:
    ans = ans.strip()
    # "$\frac{1}{2}$." -> "\frac{1}{2}"; keep only the first $...$ span if there is one.
    if ans.count("$") >= 2:
        first = ans.find("$")
        second = ans.find("$", first + 1)
        ans = ans[first + 1 : second]
    ans = ans.strip().rstrip(".").strip()
    boxed = last_boxed_only_string(ans)
    if boxed is not None:
        ans = remove_boxed(boxed)
    return ans.strip()


def _extract_answer_line(text: str) -> str | None:
    tail = text[-_ANSWER_TAIL_CHARS:]
    for regex in (_MINERVA_RE, _FINAL_ANSWER_IS_RE, _ANSWER_LINE_RE):
        matches = list(regex.finditer(tail))
        if matches:
            ans = _clean_answer_text(matches[-1].group(1))
            if ans:
                return ans
    return None


def extract_answer(text: str, mode: ExtractMode = "boxed") -> str | None:
    """The final answer of a response, without its box, or None if there is none.

    ``mode``: ``"boxed"`` the last box; ``"answer"`` Minerva style (``The final answer is X.
    I hope it is correct.``, ``Final Answer: X``, ``Answer: X``); ``"both"`` box first, then
    the answer line.
    """
    if not isinstance(text, str) or not text:
        return None
    if mode in ("boxed", "both"):
        boxed = last_boxed_only_string(text)
        if boxed is not None:
            ans = remove_boxed(boxed).strip()
            if ans:
                return ans
        if mode == "boxed":
            return None
    return _extract_answer_line(text)
