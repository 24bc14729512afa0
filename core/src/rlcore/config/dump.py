"""A resolved config back to plain data and to TOML text (``rlcore config show``).

A small dumper instead of a dependency: config values are only tables, strings, numbers,
booleans and arrays of those. ``None`` (unset optional keys) has no TOML form and is left out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["config_to_dict", "dump_toml", "format_key", "format_value"]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def config_to_dict(obj: Any) -> Any:
    """Attrs instances to dicts (recursively), tuples to lists, ``None`` fields dropped.

    Fields marked ``metadata={"flatten": True}`` (a plugin's ``options``) are merged into
    the parent table, so ``[actor.engine]`` reads ``name = ...`` then the engine's options.
    """
    if attrs.has(type(obj)):
        out: dict[str, Any] = {}
        for field in attrs.fields(type(obj)):
            value = getattr(obj, field.name)
            if value is None:
                continue
            plain = config_to_dict(value)
            if field.metadata.get("flatten") and isinstance(plain, dict):
                out.update(plain)
            else:
                out[field.name] = plain
        return out
    if isinstance(obj, Mapping):
        return {str(k): config_to_dict(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list | tuple):
        return [config_to_dict(v) for v in obj]
    return obj


def format_key(key: str | int) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def format_value(value: Any) -> str:
    """One value in TOML syntax (inline tables for nested mappings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        items = ", ".join(f"{format_key(k)} = {format_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    msg = f"cannot write {type(value).__name__} value {value!r} as TOML"
    raise TypeError(msg)


def dump_toml(data: Mapping[str, Any]) -> str:
    """Nested mappings as ``[a.b]`` tables, scalars and arrays as ``key = value``."""
    lines: list[str] = []
    _dump_table(data, (), lines)
    return "\n".join(lines).strip() + "\n"


def _dump_table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    tables = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    # A header only where the table has keys of its own (or nothing at all).
    if path and (scalars or not tables):
        lines.append("")
        lines.append("[" + ".".join(format_key(p) for p in path) + "]")
    for key, value in scalars.items():
        lines.append(f"{format_key(key)} = {format_value(value)}")
    for key, value in tables.items():
        _dump_table(value, (*path, key), lines)
