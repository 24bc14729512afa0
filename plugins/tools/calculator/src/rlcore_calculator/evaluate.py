"""Arithmetic on model-written text by walking its AST: no ``eval``, no names, no calls.

Only number literals, ``+ - * / // % **``, unary ``+ -`` and parentheses are accepted; every
other node is refused. Work is bounded before and during evaluation: the text length, the
node count, the size of an exponent and the magnitude of every intermediate result, so a
hostile ``9**9**9**9`` or a 100 kB expression is refused in microseconds.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Final

__all__ = ["CalculatorError", "evaluate", "format_number"]

MAX_CHARS: Final = 200
MAX_NODES: Final = 100
MAX_EXPONENT: Final = 64
MAX_MAGNITUDE: Final = 1e18

_BINARY: Final[dict[type[ast.operator], Callable[[float, float], float]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: Final[dict[type[ast.unaryop], Callable[[float], float]]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
# What people (and models) write for * / **.
_SPELLINGS: Final = {"×": "*", "÷": "/", "^": "**", ",": ""}


class CalculatorError(ValueError):
    """The expression is not plain arithmetic, or exceeds a limit; the message says which."""


def evaluate(expression: str) -> float | int:
    """The value of an arithmetic expression. ``evaluate("12 * (3 + 4)") == 84``."""
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        msg = f"expression longer than {MAX_CHARS} characters"
        raise CalculatorError(msg)
    for spelled, op in _SPELLINGS.items():
        text = text.replace(spelled, op)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        msg = f"not an arithmetic expression: {text!r}"
        raise CalculatorError(msg) from err
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        msg = f"expression has more than {MAX_NODES} parts"
        raise CalculatorError(msg)
    return _check(_eval(tree.body))


def _eval(node: ast.expr) -> float | int:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            msg = f"only numbers are allowed, got {node.value!r}"
            raise CalculatorError(msg)
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            msg = f"exponent {format_number(right)} is larger than {MAX_EXPONENT}"
            raise CalculatorError(msg)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as err:
            raise CalculatorError("division by zero") from err
        except OverflowError as err:
            raise CalculatorError("result too large") from err
        if isinstance(value, complex):
            raise CalculatorError("result is not a real number")
        return _check(value)
    msg = f"unsupported syntax: {type(node).__name__} (only numbers, + - * / // % ** and ( ))"
    raise CalculatorError(msg)


def _check(value: float | int) -> float | int:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        msg = f"result larger than {MAX_MAGNITUDE:g}"
        raise CalculatorError(msg)
    return value


def format_number(value: float | int) -> str:
    """``84`` for 84.0, else up to 10 significant digits: ``0.3333333333``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return f"{value:.10g}"
