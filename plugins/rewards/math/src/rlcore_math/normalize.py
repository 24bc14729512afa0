"""String normalisation of LaTeX answers and exact parsing of plain numbers.

A blend of Hendrycks' ``strip_string`` (MATH), the Minerva/verl ``normalize_final_answer``
and lm-eval's fixes: ``\\left``/``\\right``, ``\\dfrac``/``\\tfrac``, ``\\text{}`` and
units, degrees, percentages, spaces, ``\\frac12``, ``a/b``, leading zeros, ``x=`` prefixes.

No regex here nests quantifiers, and inputs are bounded by the caller (``MAX_ANSWER_CHARS``),
so normalising is linear and fast. Nothing is evaluated: numbers are parsed with
``fractions.Fraction`` from strings that a strict regex has already matched.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "MAX_ANSWER_CHARS",
    "base_subscripts",
    "normalize_answer",
    "parse_number",
    "split_top_level",
    "unit_powers",
    "unwrap_outer_text",
]

# No MATH/Minerva/AMC/AIME reference answer is longer than ~300 characters; anything past
# this is treated as a wrong answer without further work (keeps every step bounded).
MAX_ANSWER_CHARS = 1000

# Unit words removed when they trail a number (verl's list, MATH's answers).
_UNIT_WORDS = (
    "square units",
    "sq units",
    "square feet",
    "square inches",
    "square meters",
    "square cm",
    "units",
    "unit",
    "degrees",
    "degree",
    "dollars",
    "dollar",
    "cents",
    "cent",
    "inches",
    "inch",
    "feet",
    "foot",
    "ft",
    "meters",
    "meter",
    "cm",
    "mm",
    "km",
    "kg",
    "mph",
    "hours",
    "hour",
    "minutes",
    "minute",
    "seconds",
    "second",
    "sec",
    "days",
    "day",
    "years",
    "year",
    "points",
    "point",
    "ways",
    "way",
    "students",
    "people",
    "pounds",
    "pound",
    "miles",
    "mile",
    "ml",
    "liters",
    "liter",
    "percent",
    "edges",
    "meals",
    "digits",
    "integers",
    "yards",
    "yard",
    "books",
    "coins",
    "marbles",
    "sides",
    "cubic feet",
    "cubic units",
)
# A trailing \text{...} of letters after a number is a unit ("5\text{ cm}^2", "6.5\mathrm{~m}");
# bare words only from the list above ("12 dollars"), so a variable like "3m" is kept.
_UNIT_TEXT_RE = re.compile(
    r"(?<=[0-9}.)])\s*\\(?:text|mbox|mathrm|textrm)\{\s*[a-zA-Z ]{1,30}(?:\^\{?[23]\}?)?\s*\}"
    r"(?:\^\{?[23]\}?)?\s*$"
)
_UNIT_WORD_POWER_RE = re.compile(
    r"(?<=[0-9}.)])\s*(?:"
    + "|".join(sorted((re.escape(u) for u in _UNIT_WORDS), key=len, reverse=True))
    + r")\^\{?(\d{1,3})\}?\s*$"
)
_UNIT_WORD_RE = re.compile(
    r"(?<=[0-9}.)])\s*(?:"
    + "|".join(sorted((re.escape(u) for u in _UNIT_WORDS), key=len, reverse=True))
    + r")(?:\^\{?[23]\}?)?\s*$"
)
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|mbox|mathrm|mathbf|mathit|operatorname|rm|bf)"
    r"\s*\{([^{}]*)\}"
)
_LEFT_RIGHT_RE = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\s*"
    r"(\\[{}|]|[()\[\]|.]|\\[lr](?:vert|angle|floor|ceil))"
)
_SPACING_RE = re.compile(r"\\[,;:! ]|\\quad|\\qquad|\\displaystyle|\\limits")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_FRAC_SHORT_RE = re.compile(r"\\frac\s*(\d)\s*(\d)")  # \frac12 -> \frac{1}{2}
_FRAC_HALF_RE = re.compile(r"\\frac\s*(\{[^{}]*\})\s*(\d)")  # \frac{a}2
_FRAC_FIRST_RE = re.compile(r"\\frac\s*(\d)\s*(\{[^{}]*\})")  # \frac1{b}
_SQRT_SHORT_RE = re.compile(r"\\sqrt\s*(\w)")  # \sqrt2 -> \sqrt{2}
_A_SLASH_B_RE = re.compile(r"^(-?)(\d+)/(\d+)$")
_VAR_PREFIX_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*(?=\S)|^\\[a-zA-Z]+\s*=\s*(?=\S)")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_LEADING_ZEROS_RE = re.compile(r"(?<![\d.])0+(?=\d)")


# The power of a unit: "\mbox{ inches}^3", "\text{cm}^{2}", "\text{ m^2}", "square feet".
_UNIT_POWER_RE = re.compile(
    r"\\(?:text|mbox|mathrm|textrm)\{\s*[a-zA-Z ]{1,30}(?:\^\{?(\d{1,3})\}?)?\s*\}"
    r"(?:\^\{?(\d{1,3})\}?)?"
)
_UNIT_POWER_WORD_RE = re.compile(r"\b(square|sq|cubic)\b")
# A number written in a base: "52_9", "1011_{2}", "A3_{16}" (digits/capitals, then _base).
_BASE_SUBSCRIPT_RE = re.compile(r"(?<![a-z\\])([0-9A-Z]+)\s*_\s*\{?\s*(\d+)\s*\}?")


def unit_powers(answer: str) -> tuple[int, ...]:
    """The powers of the units in an answer: ``"864 \\mbox{ inches}^3"`` -> ``(3,)``.

    :func:`normalize_answer` drops units (a reference with units must match a bare number);
    two answers that both state a unit power must state the same one (cm^2 is not cm^3).
    """
    powers = [
        int(next(g for g in m.groups() if g))
        for m in _UNIT_POWER_RE.finditer(answer)
        if any(m.groups())
    ]
    m = _UNIT_WORD_POWER_RE.search(answer)
    if m:
        powers.append(int(m.group(1)))
    for m in _UNIT_POWER_WORD_RE.finditer(answer):
        powers.append(3 if m.group(1) == "cubic" else 2)
    return tuple(sorted(powers))


def base_subscripts(answer: str) -> tuple[tuple[str, int], ...]:
    """The numbers written in a base: ``"52_9"`` -> ``(("52", 9),)``.

    math-verify drops subscripts (``52_9`` parses as 52), so such answers are compared here:
    both must write the same digits in the same bases.
    """
    out = []
    for m in _BASE_SUBSCRIPT_RE.finditer(answer):
        digits = m.group(1).lstrip("0") or "0"
        out.append((digits, int(m.group(2))))
    return tuple(sorted(out))


_OUTER_TEXT_RE = re.compile(r"^\\(?:text|textbf|textrm|mbox|mathrm)\s*\{")


def unwrap_outer_text(answer: str) -> str:
    """``\\text{3\\sqrt{13}}`` -> ``3\\sqrt{13}``: a text command around the whole answer
    (nested braces inside, which the unit and text rules below do not take apart)."""
    s = answer.strip()
    m = _OUTER_TEXT_RE.match(s)
    if not m or not s.endswith("}"):
        return answer
    depth = 0
    for k in range(m.end() - 1, len(s)):
        depth += {"{": 1, "}": -1}.get(s[k], 0)
        if depth == 0:
            return s[m.end() : -1].strip() if k == len(s) - 1 else answer
    return answer


def _unwrap_text(s: str) -> str:
    # \text{\textbf{x}}: unwrap innermost first, a bounded number of times.
    for _ in range(5):
        new = _TEXT_CMD_RE.sub(r"\1", s)
        if new == s:
            break
        s = new
    return s


def normalize_answer(answer: str) -> str:
    """A canonical string for comparing two answers; equal strings mean equal answers.

    Example: ``"\\left( 3, \\dfrac{\\pi}{2} \\right)"`` -> ``"(3,\\frac{\\pi}{2})"``,
    ``"x = 025^\\circ"`` -> ``"25"``, ``"10\\%"`` -> ``"10"``, ``"1,000"`` -> ``"1000"``.
    """
    s = str(answer).strip()[: MAX_ANSWER_CHARS * 2]
    if s.startswith("\\boxed") or s.startswith("\\fbox"):
        from rlcore_math.extract import remove_boxed

        s = remove_boxed(s)
    # "\$36": the escaped dollar first, or removing "$" would leave a stray backslash.
    s = s.replace("\n", " ").replace("\\$", "").replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\dbinom", "\\binom").replace("\\tbinom", "\\binom")
    s = _LEFT_RIGHT_RE.sub(r"\1", s)
    s = s.replace("\\left.", "").replace("\\right.", "")
    s = _SPACING_RE.sub(" ", s)
    s = s.replace("~", " ").replace("{,}", "")
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\leq", "\\le").replace("\\geq", "\\ge").replace("\\infty", "\\infty")
    s = s.replace("\\lbrace", "\\{").replace("\\rbrace", "\\}")
    # Units: "5 \text{ cm}^2", "5\mbox{ inches}", "12 dollars".
    for _ in range(2):
        s = _UNIT_WORD_RE.sub("", _UNIT_TEXT_RE.sub("", s.strip()))
    s = _unwrap_text(s)
    s = s.strip().rstrip(".").strip()
    s = _VAR_PREFIX_RE.sub("", s)
    s = s.replace(" ", "")
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(r"\\frac\1{\2}", s)
    s = _FRAC_FIRST_RE.sub(r"\\frac{\1}\2", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    m = _A_SLASH_B_RE.match(s)
    if m:
        s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    # "(113)" / "{5}" around a lone number, e.g. AIME's "\textbf{(113) }".
    inner = s[1:-1] if len(s) > 2 and s[0] + s[-1] in ("()", "{}") else None
    if inner is not None and parse_number(inner) is not None:
        s = inner
    s = _LEADING_ZEROS_RE.sub("", s)
    if s.startswith("."):
        s = "0" + s
    s = s.replace("-.", "-0.")
    return s


# A plain number: integer, decimal, scientific (1.6e-19, 1.6\times10^{-19}, 10^{5}),
# \frac{a}{b}, a/b, with an optional sign. Everything else returns None.
_NUM = r"\d+(?:\.\d*)?|\.\d+"
_DEC_RE = re.compile(rf"^([+-]?)({_NUM})(?:[eE]([+-]?\d{{1,4}}))?$")
_SCI_RE = re.compile(rf"^([+-]?)(?:({_NUM})(?:\\times|\\cdot|\*|x))?10\^\{{?([+-]?\d{{1,4}})\}}?$")
_FRAC_RE = re.compile(rf"^([+-]?)\\frac\{{({_NUM})\}}\{{({_NUM})\}}$")
_SLASH_RE = re.compile(rf"^([+-]?)({_NUM})/({_NUM})$")


def parse_number(s: str) -> Fraction | None:
    """The exact value of a normalised plain number, or None if ``s`` is not one."""
    if not s or len(s) > 60:
        return None
    try:
        m = _DEC_RE.match(s)
        if m:
            value = Fraction(m.group(2))
            if m.group(3):
                value *= Fraction(10) ** int(m.group(3))
            return -value if m.group(1) == "-" else value
        m = _SCI_RE.match(s)
        if m:
            mant = Fraction(m.group(2)) if m.group(2) else Fraction(1)
            value = mant * Fraction(10) ** int(m.group(3))
            return -value if m.group(1) == "-" else value
        for regex in (_FRAC_RE, _SLASH_RE):
            m = regex.match(s)
            if m:
                den = Fraction(m.group(3))
                if den == 0:
                    return None
                value = Fraction(m.group(2)) / den
                return -value if m.group(1) == "-" else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


_OPEN = "([{"
_CLOSE = ")]}"


def split_top_level(s: str) -> tuple[str, list[str], str] | None:
    """``"(1,\\frac{1}{2}]"`` -> ``("(", ["1", "\\frac{1}{2}"], "]")``; None if not a tuple.

    A tuple or interval is a bracketed, comma-separated list of at least two items, or an
    unbracketed list ``"1,2,3"``. Commas inside nested brackets do not split.
    """
    if "," not in s:
        return None
    opener = closer = ""
    body = s
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        opener, closer, body = s[0], s[-1], s[1:-1]
    elif s.startswith("\\{") and s.endswith("\\}"):
        opener, closer, body = "\\{", "\\}", s[2:-2]
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in body:
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                return None  # "(1),(2)": the outer brackets were not a pair
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    if depth != 0 or len(items) < 2 or any(not item for item in items):
        return None
    return opener, items, closer
