"""The code in a model's response: a fenced Markdown block, else the whole text.

Fences are found line by line (one pass, so 100 kB of backticks costs what 100 kB of text
does): a line opening with three or more backticks or tildes and an optional language, up to a
line of at least as many of the same character. A block left open at the end (the response
was cut at the length limit) runs to the end.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["Block", "code_blocks", "extract_code", "with_prefix"]

Block = Literal["last", "first", "all"]
PYTHON = frozenset({"python", "py", "python3", "py3"})
_OPEN = re.compile(r"(`{3,}|~{3,})\s*([^\s`]*)")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block as ``(language, code)``; the language is lower-case, "" when none."""
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    lang = ""
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if fence is None:
            found = _OPEN.fullmatch(stripped)
            if found:
                fence, lang, lines = found.group(1), found.group(2).lower(), []
        elif len(stripped) >= len(fence) and stripped == fence[0] * len(stripped):
            blocks.append((lang, "\n".join(lines)))
            fence = None
        else:
            lines.append(line)
    if fence is not None:
        blocks.append((lang, "\n".join(lines)))
    return blocks


def extract_code(text: str, block: Block = "last") -> str | None:
    """The Python code of a response, or None when it has none.

    Python blocks (``python``, ``py``, ``python3``) win over blocks without a language;
    blocks in other languages are ignored. ``block`` picks the ``last`` (a model's final
    answer), the ``first``, or ``all`` of them joined. Without any fence the whole response
    is the code.

    >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1'
    >>> extract_code("```bash\\nls\\n```") is None
    True
    """
    blocks = code_blocks(text)
    if not blocks:
        return text if text.strip() else None
    chosen = [code for lang, code in blocks if lang in PYTHON]
    if not chosen:
        chosen = [code for lang, code in blocks if not lang]
    chosen = [code for code in chosen if code.strip()]
    if not chosen:
        return None
    if block == "first":
        return chosen[0]
    if block == "all":
        return "\n\n".join(chosen)
    return chosen[-1]


def with_prefix(code: str, prefix: str | None) -> str:
    """``prefix`` (the row's ``extra_info["code_prefix"]``), a line break, then ``code``.

    HumanEval's prompt is a signature and a docstring (a complete function that returns
    None) that a completion continues, sometimes after helpers its tests use
    (``encode_cyclic`` for ``decode_cyclic``). A completion-style response (the body only)
    continues it; a chat response with the whole function redefines the stub. Both score.
    """
    if not prefix:
        return code
    return prefix + ("" if prefix.endswith("\n") else "\n") + code
