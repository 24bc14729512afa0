"""Raw TOML data -> attrs instances, with every error kept as (key path, one-line message).

One cattrs converter (``forbid_extra_keys``) with strict hooks for TOML's scalar types: the
stock ``int()``/``float()`` coercions would turn ``1.5`` into ``1`` and ``"1e-5"`` into a
float without a word. Instances are built with validators off, then every field's validator
runs on its own, so two bad values in one table are both reported.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)
from cattrs.gen import make_dict_structure_fn
from cattrs.preconf.tomllib import make_converter

from rlcore.config.dump import format_key, format_value
from rlcore.errors import ConfigError

__all__ = ["Path", "Problem", "describe", "render_path", "structure", "unknown_key"]

Path = tuple[str | int, ...]
Problem = tuple[Path, str]


class _Invalid(ValueError):
    """Errors found by a hook, relative to the value it structured."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(m for _, m in problems))
        self.problems = problems


def describe(value: Any) -> str:
    """A value as it reads in TOML, tables as ``a table``."""
    if isinstance(value, Mapping):
        return "a table"
    try:
        return format_value(value)
    except TypeError:
        return repr(value)


def render_path(path: Path) -> str:
    out = ""
    for part in path:
        key = format_key(part)
        out += key if isinstance(part, int) or not out else f".{key}"
    return out


def unknown_key(key: str, candidates: Iterable[str], what: str = "key") -> str:
    names = sorted(set(candidates))
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    # Spelled-out abbreviations that difflib scores low: learning_rate -> lr.
    initials = "".join(word[:1] for word in key.split("_"))
    if not close and len(initials) > 1 and initials in names:
        close = [initials]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {what}{hint}"


# --- strict hooks ---------------------------------------------------------------------------


def _expect(value: Any, expected: str) -> _Invalid:
    return _Invalid([((), f"expected {expected}, got {describe(value)}")])


def _int(value: Any, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expect(value, "an integer")
    return value


def _float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _expect(value, "a number")
    # TOML has inf and nan; no key means "unbounded" by inf (limits use 0 or an unset key),
    # and nan passes no comparison, so either would only fail later, far from the config.
    if not math.isfinite(value):
        raise _expect(value, "a finite number")
    return float(value)


def _str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise _expect(value, "a string")
    return value


def _bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise _expect(value, "true or false")
    return value


def _literal(value: Any, tp: Any) -> Any:
    options = get_args(tp)
    if value not in options or isinstance(value, bool) != isinstance(options[0], bool):
        choices = ", ".join(format_value(o) for o in options)
        raise _Invalid([((), f"must be one of {choices}; got {describe(value)}")])
    return value


def _origin(tp: Any) -> Any:
    return get_origin(tp)


def _make_converter() -> cattrs.Converter:
    conv = make_converter(forbid_extra_keys=True)
    conv.register_structure_hook(int, _int)
    conv.register_structure_hook(float, _float)
    conv.register_structure_hook(str, _str)
    conv.register_structure_hook(bool, _bool)
    conv.register_structure_hook_func(lambda t: _origin(t) is Literal, _literal)

    def tuple_hook(value: Any, tp: Any) -> tuple[Any, ...]:
        args = get_args(tp)
        homogeneous = len(args) == 2 and args[1] is Ellipsis
        # A single string where a list of strings is expected: `default = "gsm8k"`.
        if homogeneous and args[0] is str and isinstance(value, str):
            return (value,)
        if not isinstance(value, list | tuple):
            raise _expect(value, "an array")
        if not homogeneous and len(value) != len(args):
            raise _expect(value, f"an array of {len(args)} values")
        types = [args[0]] * len(value) if homogeneous else list(args)
        return tuple(_collect(list(value), types, conv))

    def dict_hook(value: Any, tp: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _expect(value, "a table")
        _, value_type = get_args(tp)
        keys = list(value)
        items = _collect([value[k] for k in keys], [value_type] * len(keys), conv, keys)
        return dict(zip(keys, items))

    def attrs_factory(cl: type) -> Callable[[Any, Any], Any]:
        fn: Callable[[Any, Any], Any] = make_dict_structure_fn(
            cl, conv, _cattrs_forbid_extra_keys=True
        )

        def hook(value: Any, _: Any) -> Any:
            if not isinstance(value, Mapping):
                raise _expect(value, "a table")
            return fn(value, cl)

        return hook

    conv.register_structure_hook_func(lambda t: _origin(t) is tuple, tuple_hook)
    conv.register_structure_hook_func(lambda t: _origin(t) is dict, dict_hook)
    conv.register_structure_hook_factory(attrs.has, attrs_factory)
    return conv


def _collect(
    values: list[Any], types: list[Any], conv: cattrs.Converter, keys: list[Any] | None = None
) -> list[Any]:
    out: list[Any] = []
    problems: list[Problem] = []
    for i, (item, tp) in enumerate(zip(values, types)):
        key = keys[i] if keys is not None else i
        try:
            out.append(conv.structure(item, tp))
        except Exception as err:  # cattrs errors of any kind, flattened below
            problems.extend(((key, *p), m) for p, m in _flatten(err, ()))
    if problems:
        raise _Invalid(problems)
    return out


_CONVERTER = _make_converter()


# --- error trees to (path, message) ---------------------------------------------------------


def _flatten(err: BaseException, path: Path, candidates: Iterable[str] = ()) -> list[Problem]:
    if isinstance(err, _Invalid):
        return [((*path, *p), m) for p, m in err.problems]
    if isinstance(err, ClassValidationError):
        problems: list[Problem] = []
        with_notes, without = err.group_exceptions()
        for sub, note in with_notes:
            problems.extend(_flatten(sub, (*path, note.name)))
        for sub in without:
            if isinstance(sub, ForbiddenExtraKeysError):
                names = [f.name for f in attrs.fields(sub.cl)] + list(candidates)
                for key in sorted(sub.extra_fields):
                    problems.append(((*path, key), unknown_key(key, names)))
            else:
                problems.extend(_flatten(sub, path))
        return problems
    if isinstance(err, IterableValidationError):
        problems = []
        with_notes_i, without_i = err.group_exceptions()
        for sub, inote in with_notes_i:
            problems.extend(_flatten(sub, (*path, inote.index)))
        for sub in without_i:
            problems.extend(_flatten(sub, path))
        return problems
    if isinstance(err, KeyError):
        return [(path, "missing required key")]
    return [(path, str(err))]


def _validator_message(err: Exception, value: Any) -> str:
    args = err.args
    if isinstance(err, ValueError) and len(args) == 4 and isinstance(args[2], Iterable):
        # attrs.validators.in_: (msg, attribute, options, value)
        choices = ", ".join(format_value(o) for o in args[2])
        return f"must be one of {choices}; got {describe(value)}"
    if isinstance(err, TypeError) and len(args) == 4 and isinstance(args[2], type | tuple):
        expected = args[2].__name__ if isinstance(args[2], type) else args[2]
        return f"expected {expected}, got {describe(value)}"
    text = str(args[0]) if args else type(err).__name__
    # attrs number validators: "'lr' must be > 0.0: -1.0"
    if text.startswith("'") and " must be " in text and text.endswith(f": {value}"):
        cond = text.split(" must be ", 1)[1].rsplit(": ", 1)[0]
        return f"must be {cond}, got {describe(value)}"
    return text


def validate_instance(obj: Any, path: Path) -> list[Problem]:
    """Run every field validator of ``obj`` and of the attrs instances it holds."""
    problems: list[Problem] = []
    if attrs.has(type(obj)):
        for field in attrs.fields(type(obj)):
            value = getattr(obj, field.name)
            if field.validator is not None:
                try:
                    field.validator(obj, field, value)
                except (ValueError, TypeError) as err:
                    problems.append(((*path, field.name), _validator_message(err, value)))
                except ConfigError as err:  # a plugin's validator: its text, at its key path
                    problems.append(((*path, field.name), str(err)))
            problems.extend(validate_instance(value, (*path, field.name)))
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            problems.extend(validate_instance(value, (*path, key)))
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            problems.extend(validate_instance(value, (*path, i)))
    return problems


def structure(
    raw: Any, cl: type, path: Path, candidates: Iterable[str] = ()
) -> tuple[Any, list[Problem]]:
    """Build ``cl`` from ``raw``; return ``(instance or None, problems)``.

    ``candidates`` are extra key names offered by "did you mean" (the core keys that share
    a table with a plugin's options).
    """
    try:
        with attrs.validators.disabled():
            obj: Any = _CONVERTER.structure(raw, cl)
    except Exception as err:  # cattrs wraps anything a hook or __init__ raises
        return None, _flatten(err, path, candidates)
    problems = validate_instance(obj, path)
    return (None if problems else obj), problems
