"""A run's TOML file and its command-line overrides (``key.path=value``) -> one raw table, with
one line per error naming the file and key."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path as FilePath
from typing import Any

from rlcore.errors import ConfigError

# --- files and overrides ----------------------------------------------------------------------


def read_toml(path: str | FilePath) -> dict[str, Any]:
    """Parse a TOML file; a missing, unreadable, binary or malformed file is one line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as err:
        msg = f"config file '{path}' not found"
        raise ConfigError(msg) from err
    except OSError as err:
        msg = f"cannot read config file '{path}': {err.strerror or err}"
        raise ConfigError(msg) from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:  # a binary file, or Latin-1 / cp1252 text
        msg = (
            f"config file '{path}' is not UTF-8 text ({err.reason} at byte {err.start}); "
            "save it as UTF-8"
        )
        raise ConfigError(msg) from err
    return parse_toml(text, str(path))


def parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(_toml_error(source, err)) from err
    except RecursionError as err:  # tomllib recurses once per nested array or inline table
        raise ConfigError(_TOO_DEEP.format(source=source)) from err


_TOO_DEEP = (
    "invalid TOML in {source}: arrays or inline tables nested too deeply to read (hundreds "
    "of levels); a config needs a few"
)


def _toml_error(source: str, err: tomllib.TOMLDecodeError) -> str:
    text = str(err)
    m = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", text)
    if m:
        return f"invalid TOML in {source} at line {m[2]}, column {m[3]}: {m[1]}"
    return f"invalid TOML in {source}: {text}"


def _parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        msg = f"override {text!r}: expected KEY=VALUE, e.g. actor.optim.lr=1e-5"
        raise ConfigError(msg)
    bad_key = f"override {text!r}: {key!r} is not a valid key path"
    if "\n" in key or "\r" in key:
        # A dotted key never spans lines; one that does smuggles in table headers
        # ('[a]\n[b]\nc'), which the document parse below would accept as other keys.
        raise ConfigError(bad_key)
    try:
        # TOML's own dotted-key grammar, quoted keys included: reward.sources."openai/gsm8k"
        parsed: Any = tomllib.loads(f"{key} = 0")
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(bad_key) from err
    parts: list[str] = []
    # One chain of one-key tables ending in the 0 written above, nothing else.
    while isinstance(parsed, dict) and len(parsed) == 1:
        ((name, parsed),) = parsed.items()
        parts.append(name)
    if not parts or type(parsed) is not int or parsed != 0:
        raise ConfigError(bad_key)
    try:
        document = tomllib.loads(f"v = {value}")
    except tomllib.TOMLDecodeError:
        return tuple(parts), value  # a bare word: `rollout.name=vllm`
    except RecursionError as err:
        raise ConfigError(_TOO_DEEP.format(source=f"override {key!r}")) from err
    if set(document) != {"v"}:
        msg = (
            f"override {text!r}: the value is more than one TOML value (a newline and "
            "another key or table header); give one value, e.g. a number, string or [array]"
        )
        raise ConfigError(msg)
    return tuple(parts), document["v"]


def _merge(table: dict[str, Any], value: dict[str, Any]) -> None:
    """Merge ``value`` into ``table`` key by key, tables into tables (in place)."""
    for key, item in value.items():
        if isinstance(item, dict) and isinstance(table.get(key), dict):
            _merge(table[key], item)
        else:
            table[key] = item


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> list[str]:
    """Set ``a.b.c=value`` overrides in ``raw`` (in place); return one line per bad one.

    An inline table given for an existing table merges into it: ``actor.optim={warmup_steps=1}``
    sets ``warmup_steps`` and keeps the file's ``lr`` (replacing the table would silently reset
    every key it did not repeat to its default).
    """
    errors = []
    for text in overrides:
        try:
            parts, value = _parse_override(text)
        except ConfigError as err:
            errors.append(str(err))
            continue
        table = raw
        for i, part in enumerate(parts[:-1]):
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                where = ".".join(parts[: i + 1])
                errors.append(f"override {text!r}: {where} is not a table")
                break
            table = nxt
        else:
            last = parts[-1]
            if isinstance(value, dict) and isinstance(table.get(last), dict):
                _merge(table[last], value)
            else:
                table[last] = value
    return errors
