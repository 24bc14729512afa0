"""The rlcore side of ``from-verl``: the keys the selected plugins accept, and each converted
value checked against its key's type before anything is written.

A key's type comes from its declaration (``key(...)``, the same source as docs/config.md), so
a value the key cannot hold is refused here with the verl key named, not written out for the
loader to refuse later: ``.inf``/``1e400`` (floats are finite in every rlcore key), integers
outside TOML's 64 bits (``2**64``), text in a number key that is not a number. Text that is a
number (``"1e-4"``, as YAML 1.1 and quoted values give it) becomes the number, one line each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rlcore.errors import ConfigError

__all__ = ["check_values", "prune", "selected_keys"]

_INT64 = (-(2**63), 2**63 - 1)  # TOML's integers (tomllib reads more; the spec does not)
_ALWAYS = ("reward.sources", "trainer.loggers")  # tables written whole


def selected_keys(out: Mapping[str, Any]) -> dict[str, str] | None:
    """Key -> TOML type of every key the core and the plugins ``out`` selects accept
    (None: a selected plugin is not installed; the loader names it and how to install it)."""
    from rlcore.config.reference import SLOTS, core_keys, plugin_keys
    from rlcore.errors import PluginError
    from rlcore.plugins import default_registry

    registry = default_registry()
    keys = {d.key: d.type for d in core_keys(registry)}
    for slot in SLOTS:
        if slot.default is None:
            continue
        node: Any = out
        for part in slot.selected_by.split("."):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        name = node if isinstance(node, str) else slot.default
        tables = [slot.table] + (["ref.engine"] if slot.kind == "engine" else [])
        for table in tables:
            try:
                docs = plugin_keys(registry, slot.kind, name, table=table)
            except PluginError:
                return None
            keys.update((d.key, d.type) for d in docs)
    for name in out.get("trainer", {}).get("loggers", ()):
        if name in registry.names("logger"):
            keys.update((d.key, d.type) for d in plugin_keys(registry, "logger", name))
    return keys


def prune(
    out: dict[str, Any], accepted: Mapping[str, str], origin: Mapping[str, str], unmapped: list[Any]
) -> dict[str, Any]:
    """``out`` without the keys the selected plugins do not have (each reported)."""

    def walk(node: dict[str, Any], prefix: str) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path in _ALWAYS or path in accepted:
                kept[key] = value
            elif isinstance(value, dict) and any(k.startswith(f"{path}.") for k in accepted):
                kept[key] = walk(value, f"{path}.")
            else:
                verl = origin.get(path, path)
                unmapped.append((verl, value, f"-> {path}, which the selected plugin lacks"))
        return kept

    return walk(out, "")


def _number(text: str) -> float | int | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def check_values(
    out: dict[str, Any], types: Mapping[str, str], origin: Mapping[str, str], notes: list[str]
) -> None:
    """Refuse (one line) what a key cannot hold; text that is a number becomes it (noted)."""

    def name(path: str) -> str:
        verl = origin.get(path)
        return f"verl's {verl} (-> {path})" if verl else path

    def check(path: str, value: Any) -> Any:
        kind = types.get(path, "")
        if isinstance(value, str) and kind in ("float", "integer"):
            number = _number(value.strip())
            if number is None or (kind == "integer" and not isinstance(number, int)):
                article = "an" if kind == "integer" else "a"
                msg = f"{name(path)} = {_short(value)}: {path} takes {article} {kind}"
                raise ConfigError(msg)
            number = float(number) if kind == "float" else number
            notes.append(f"{name(path)}: text {value!r} written as the {kind} {number!r}")
            value = number
        if isinstance(value, float) and not math.isfinite(value):
            msg = f"{name(path)} = {value!r}: not a finite number, which {path} needs"
            raise ConfigError(msg)
        if isinstance(value, int) and not isinstance(value, bool):
            if not _INT64[0] <= value <= _INT64[1]:
                msg = f"{name(path)} = {_short(value)}: outside the 64-bit integers a TOML holds"
                raise ConfigError(msg)
            if kind == "float":
                value = float(value)
        if isinstance(value, list):
            if any(item is None for item in value):
                msg = f"{name(path)} = {_short(value)}: null in a list, which TOML cannot hold"
                raise ConfigError(msg)
            value = [check(path, item) for item in value]
        elif isinstance(value, dict):
            walk(value, f"{path}.")
        elif not isinstance(value, str | int | float):  # bool is an int
            kind_of = type(value).__name__
            msg = (
                f"{name(path)} = {_short(value)}: a YAML {kind_of} value, which {path} cannot hold"
            )
            raise ConfigError(msg)
        return value

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, f"{path}.")
            else:
                node[key] = check(path, value)

    walk(out, "")
