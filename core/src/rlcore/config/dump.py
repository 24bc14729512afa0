"""A resolved config back to plain data and to TOML text (``rlcore config show``).

TOML is written by ``tomli-w``; ``None`` (unset optional keys) has no TOML form and is left
out by :func:`config_to_dict`. :func:`format_key`/:func:`format_value` render single keys and
values in TOML syntax for error messages.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["config_to_dict", "dump_toml", "format_key", "format_value", "unset_keys"]

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


def unset_keys(obj: Any, prefix: str = "") -> list[str]:
    """The dotted paths of the ``None`` fields that :func:`config_to_dict` leaves out
    (``trainer.grad_norm_ceiling`` when no ceiling is set); plugin options included."""
    out: list[str] = []
    if attrs.has(type(obj)):
        for field in attrs.fields(type(obj)):
            value = getattr(obj, field.name)
            if field.metadata.get("flatten"):  # a plugin's options, in its section's table
                out.extend(unset_keys(value, prefix))
            elif value is None:
                out.append(f"{prefix}{field.name}")
            elif attrs.has(type(value)):
                out.extend(unset_keys(value, f"{prefix}{field.name}."))
    return out


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
    import tomli_w

    return tomli_w.dumps(dict(data))
