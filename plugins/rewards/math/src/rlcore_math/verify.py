"""Is a predicted answer equal to the reference? Cheap exact checks first, then math-verify.

Order of checks (the first that decides wins):

0. what normalising and math-verify would drop: both answers state a unit power and the
   powers differ (``cm^2`` vs ``cm^3``), or the numbers written in a base (``52_9``) are not
   the same digits in the same bases: different;
1. both normalised strings equal (:func:`rlcore_math.normalize.normalize_answer`);
2. both plain numbers (integer, decimal, ``1.6e-19``, ``3\\times10^{8}``, ``\\frac{a}{b}``,
   ``a/b``): exact comparison as ``fractions.Fraction``; unequal numbers are final;
3. both tuples/intervals of the same shape whose items are equal by 1-2;
4. math-verify (HuggingFace): LaTeX -> sympy through ``latex2sympy2_extended``'s ANTLR
   parser (it builds sympy objects from the parse tree and never calls ``eval``), then
   ``math_verify.verify`` (numeric, symbolic, set/interval, relation comparison). Only the
   ``LatexExtractionConfig`` is used: math-verify's ``ExprExtractionConfig`` goes through
   ``sympy.parse_expr``, which uses ``eval``, so it is never enabled here.

Safety of step 4: answers over ``MAX_ANSWER_CHARS`` or nested deeper than ``_MAX_DEPTH``
are not parsed; the parsed (unevaluated) trees are walked before comparison and refused when
they hold a huge number (``10^{10^{10}}``, ``(10^{10})!``, ``x^{100000}``), a sum to a
power over 100 (``(x+1)^{5000}``: expanding it takes minutes) or an unevaluated
sum/integral/limit: such values block inside C (big-int arithmetic holds the GIL) where no
timer can interrupt them, or run far past the limit. Parse + compare run under
:func:`rlcore_math.deadline.call_with_deadline`.

Imports never run under that deadline: math-verify, sympy and the ANTLR parser are imported
(and one comparison run, which loads what sympy imports lazily) by :func:`warm_up`, which
:class:`rlcore_math.reward.MathReward` calls when it is built or unpickled in a pool worker and
:func:`check_equiv` calls before arming the deadline. An import cut off half-way leaves sympy
half-loaded for the rest of the process; the deadline also defers any tick that lands inside
an import (:mod:`rlcore_math.deadline`).
"""

from __future__ import annotations

import logging
import math
import re
from functools import lru_cache
from typing import Any

from rlcore_math.deadline import DeadlineExceeded, call_with_deadline
from rlcore_math.normalize import (
    MAX_ANSWER_CHARS,
    base_subscripts,
    normalize_answer,
    parse_number,
    split_top_level,
    unit_powers,
    unwrap_outer_text,
)

__all__ = ["check_equiv", "is_equiv", "warm_up"]

log = logging.getLogger(__name__)

_MAX_DEPTH = 40  # brace/paren nesting allowed into the LaTeX parser
_MAX_NODES = 2000  # sympy tree size allowed into verify
_MAX_EXPONENT_LOG10 = 4.0  # |exponent| <= 1e4
_MAX_RESULT_LOG10 = 1e5  # values up to 100 000 digits
_MAX_FACTORIAL_LOG10 = 3.5  # n! for n <= ~3000
# (x+1)^n, (\sqrt{2}+\pi)^n: simplify() expands a sum to the n-th power into n+1 terms of
# n-digit numbers, ~90 s for n = 5000; refused above this exponent (x^n, 2^n are cheap).
_MAX_SYMBOLIC_POWER = 100

# Reasons returned by check_equiv.
STRING, NUMBER, TUPLE, MATH_VERIFY = "string", "number", "tuple", "math_verify"
DIFFERENT, EMPTY, TOO_LONG, UNSAFE, TIMEOUT = "different", "empty", "too_long", "unsafe", "timeout"
ERROR = "error"


def is_equiv(
    pred: str | None, ref: str, *, use_math_verify: bool = True, timeout_s: float | None = 2.0
) -> bool:
    """True if answer ``pred`` equals reference ``ref`` (both without ``\\boxed``)."""
    return check_equiv(pred, ref, use_math_verify=use_math_verify, timeout_s=timeout_s)[0]


def check_equiv(
    pred: str | None, ref: str, *, use_math_verify: bool = True, timeout_s: float | None = 2.0
) -> tuple[bool, str]:
    """``(equal, reason)``; ``reason`` names the check that decided (see module docstring)."""
    if pred is None:
        return False, EMPTY
    pred, ref = unwrap_outer_text(str(pred)).strip(), unwrap_outer_text(str(ref)).strip()
    if not pred or not ref:
        return False, EMPTY
    if len(pred) > MAX_ANSWER_CHARS or len(ref) > MAX_ANSWER_CHARS:
        return False, TOO_LONG
    if _differ_in_what_normalising_drops(pred, ref):
        return False, DIFFERENT
    fast = _fast_equiv(normalize_answer(pred), normalize_answer(ref))
    if fast is not None:
        return fast
    if not use_math_verify:
        return False, DIFFERENT
    if _nesting_depth(pred) > _MAX_DEPTH or _nesting_depth(ref) > _MAX_DEPTH:
        return False, UNSAFE
    warm_up()  # imports happen here, never under the deadline
    try:
        verdict = call_with_deadline(lambda: _math_verify_equal(pred, ref), timeout_s)
    except DeadlineExceeded:
        return False, TIMEOUT
    except Exception as err:  # math-verify's own bug on odd input: judged wrong, never raised
        log.debug("math-verify on %r vs %r: %s: %s", pred, ref, type(err).__name__, err)
        return False, ERROR
    if verdict is None:
        return False, UNSAFE
    return verdict, MATH_VERIFY if verdict else DIFFERENT


def _differ_in_what_normalising_drops(pred: str, ref: str) -> bool:
    """Unit powers (both stated, unequal: cm^2 vs cm^3) or number bases (52_9 vs 52_8).

    Normalising drops units so that ``864`` matches ``864 \\mbox{ inches}^2``, and
    math-verify drops subscripts; without this check both would accept a changed answer.
    """
    p_units, r_units = unit_powers(pred), unit_powers(ref)
    if p_units and r_units and p_units != r_units:
        return True
    return base_subscripts(pred) != base_subscripts(ref)


def _fast_equiv(pred: str, ref: str) -> tuple[bool, str] | None:
    """A decision from normalised strings, or None to ask math-verify."""
    if not pred or not ref:
        return False, EMPTY
    if pred == ref:
        return True, STRING
    p_num, r_num = parse_number(pred), parse_number(ref)
    if p_num is not None and r_num is not None:
        return (True, NUMBER) if p_num == r_num else (False, DIFFERENT)
    p_tup, r_tup = split_top_level(pred), split_top_level(ref)
    if p_tup is not None and r_tup is not None:
        (p_open, p_items, p_close), (r_open, r_items, r_close) = p_tup, r_tup
        if (p_open, p_close) == (r_open, r_close) and len(p_items) == len(r_items):
            item_results = [_fast_equiv(p, r) for p, r in zip(p_items, r_items)]
            if all(res is not None and res[0] for res in item_results):
                return True, TUPLE
    return None


def _nesting_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth -= 1
    return deepest


# --- math-verify ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _math_verify() -> tuple[Any, Any, Any]:
    """Import math-verify lazily (sympy + ANTLR: ~0.5 s) and silence its timeout notice."""
    import math_verify
    from math_verify import grader, parser

    # We pass parsing_timeout=None / timeout_seconds=None on purpose (our own deadline runs
    # in any thread); math-verify would log a warning about that once per process.
    parser.TIMEOUT_WARNING_SHOWN = True
    grader.TIMEOUT_WARNING_SHOWN = True
    config = [math_verify.LatexExtractionConfig(boxed_match_priority=0)]
    return math_verify.parse, math_verify.verify, config


# Pairs whose comparison walks the parser, the numeric and symbolic comparison and the
# set/interval code, so that the modules sympy imports on first use are loaded by warm_up.
_WARM_UP_PAIRS = (
    ("\\sqrt{4}", "2"),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}"),
    ("(x+1)^2", "x^2+2x+1"),
    ("[1, 2)", "\\{1\\}"),
    ("x \\in (0, \\infty)", "x > 0"),
    ("\\text{(A)}\\ 3", "3"),
)


@lru_cache(maxsize=1)
def warm_up() -> None:
    """Import math-verify and sympy and run a few comparisons, outside any deadline.

    Idempotent (cached) and cheap after the first call; the first costs ~0.5-2 s (imports).
    """
    _math_verify()
    import sympy  # noqa: F401  (the safety walk below uses it)

    for pred, ref in _WARM_UP_PAIRS:
        try:
            _math_verify_equal(pred, ref)
        except Exception as err:  # a library bug must not stop the reward from being built
            log.debug("math-verify warm-up on %r: %s: %s", pred, type(err).__name__, err)


@lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple[Any, ...]:
    """Parse one answer (cached: a reference is scored against n samples)."""
    parse, _, config = _math_verify()
    # Boxing makes math-verify take the whole answer instead of searching the text for one.
    parsed = parse(
        "\\boxed{" + answer + "}",
        extraction_config=config,
        fallback_mode="no_fallback",
        parsing_timeout=None,
    )
    return tuple(parsed)


# A one-letter symbol with a subscript (``E_{1}``, ``m_p``), not a command's (``\\log_2``).
_SUBSCRIPTED_RE = re.compile(r"(?<![\\A-Za-z])([A-Za-z])_(\{[A-Za-z0-9]+\}|[A-Za-z0-9])")
_PLACEHOLDERS = "uvwpqrstabcdfghjklmnyz"


def _rename_subscripted(pred: str, ref: str) -> tuple[str, str]:
    """Replace each subscripted symbol by a fresh letter, the same in both answers.

    The LaTeX parser mangles some of them (``\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}`` parses as
    ``2/3``, so any change of the first coefficient was accepted); plain letters parse right.
    Letters that occur anywhere in either answer are not used.
    """
    names = sorted(
        {
            m.group(0).replace("{", "").replace("}", "")
            for text in (pred, ref)
            for m in _SUBSCRIPTED_RE.finditer(text)
        }
    )
    if not names:
        return pred, ref
    free = [c for c in _PLACEHOLDERS if c not in pred and c not in ref]
    if len(free) < len(names):
        return pred, ref
    table = dict(zip(names, free))

    def sub(text: str) -> str:
        return _SUBSCRIPTED_RE.sub(
            lambda m: " " + table[m.group(0).replace("{", "").replace("}", "")] + " ", text
        )

    return sub(pred), sub(ref)


def _math_verify_equal(pred: str, ref: str) -> bool | None:
    """math-verify's verdict, or None when an expression is unsafe to compare."""
    pred, ref = _rename_subscripted(pred, ref)
    gold, target = _parse(ref), _parse(pred)
    if not gold or not target:
        return False
    if not all(_is_safe(expr) for expr in (*gold, *target)):
        return None
    if "\\infty" not in pred + ref and any(_has_undefined(e) for e in (*gold, *target)):
        return None  # a parse gone wrong (``\\gamma^{2}`` read as gamma() -> zoo)
    _, verify, _ = _math_verify()
    return bool(verify(list(gold), list(target), timeout_seconds=None))


def _has_undefined(expr: Any) -> bool:
    import sympy

    return isinstance(expr, sympy.Basic) and expr.has(sympy.zoo, sympy.nan)


def _is_safe(expr: Any) -> bool:
    """Whether comparing ``expr`` stays cheap: bounded size and bounded magnitudes."""
    if isinstance(expr, str):
        return True
    budget = [_MAX_NODES]
    try:
        return _log10_bound(expr, budget) <= _MAX_RESULT_LOG10
    except (_Unsafe, RecursionError):
        return False


class _Unsafe(Exception):
    pass


def _log10_bound(expr: Any, budget: list[int]) -> float:
    """A generous upper bound of log10(|value| + 1), raising _Unsafe for runaway values.

    Symbols count as small (~1): what matters is that no power, factorial or exponential of
    a big number gets evaluated or expanded.
    """
    import sympy

    # Sums, integrals, limits: their doit() can loop over 10^10 terms.
    unevaluated = (sympy.Sum, sympy.Product, sympy.Integral, sympy.Limit, sympy.Derivative)
    budget[0] -= 1
    if budget[0] < 0:
        raise _Unsafe
    if isinstance(expr, sympy.MatrixBase):
        return max((_log10_bound(e, budget) for e in expr), default=0.0)
    if not isinstance(expr, sympy.Basic):
        return 1.0
    if isinstance(expr, sympy.Integer | sympy.Rational):
        return max(_int_log10(int(expr.p)), _int_log10(int(expr.q)))
    if isinstance(expr, sympy.Float):
        _, _, exp, bc = expr._mpf_  # mpmath (sign, mantissa, exponent, bit count)
        return max(float(exp + bc) * 0.30103, 0.0) + 1
    if isinstance(expr, unevaluated):
        raise _Unsafe
    if isinstance(expr, sympy.Pow | sympy.exp):
        base, exponent = (
            (expr.base, expr.exp) if isinstance(expr, sympy.Pow) else (sympy.E, expr.args[0])
        )
        if (
            isinstance(exponent, sympy.Rational)
            and abs(exponent) > _MAX_SYMBOLIC_POWER
            and base.has(sympy.Add)
        ):
            raise _Unsafe
        return _power_bound(_log10_bound(base, budget), _log10_bound(exponent, budget))
    if isinstance(expr, sympy.factorial | sympy.factorial2 | sympy.subfactorial | sympy.gamma):
        arg = _log10_bound(expr.args[0], budget)
        if arg > _MAX_FACTORIAL_LOG10:
            raise _Unsafe
        n = 10.0**arg
        return n * math.log10(n + 1) + 1
    if isinstance(expr, sympy.binomial | sympy.RisingFactorial | sympy.FallingFactorial):
        bounds = [_log10_bound(a, budget) for a in expr.args]
        if max(bounds) > _MAX_EXPONENT_LOG10:
            raise _Unsafe
        return 10.0 ** max(bounds) + 1
    children = [_log10_bound(a, budget) for a in expr.args]
    if not children:
        return 0.5  # symbols, pi, E, I, infinity: |value| ~ 1, never big by themselves
    if isinstance(expr, sympy.Mul):
        return sum(children)
    # Add and everything else: a sum of k terms is at most k times the largest.
    return max(children) + math.log10(len(children))


def _int_log10(n: int) -> float:
    bits = abs(n).bit_length()
    return math.log10(abs(n) + 1) if bits < 1000 else bits * 0.30103 + 1


def _power_bound(base_log10: float, exponent_log10: float) -> float:
    if exponent_log10 > _MAX_EXPONENT_LOG10:
        raise _Unsafe
    bound = base_log10 * 10.0**exponent_log10
    if bound > _MAX_RESULT_LOG10:
        raise _Unsafe
    return bound
