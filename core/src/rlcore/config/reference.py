"""Every config key with its type, default, allowed values and effect, read from the schema.

One source of truth per key: the attrs field itself. Its type and default are the field's;
its allowed values come from its validators (``in_``, ``ge``/``gt``/``le``/``lt``,
``optional``) or a ``Literal`` type; its effect is ``metadata={"help": "..."}``. Two more
metadata keys, both optional: ``"default"`` (text) for a key whose default is resolved from
other keys (``model.tokenizer_path``: ``model.path``), and ``"allowed"`` (text) for a
validator written as a function.

The core's sections come from :class:`~rlcore.config.schema.RunConfig`; each installed
plugin's ``Config`` is read where its keys sit in a run's TOML (:data:`SLOTS`).

``python -m rlcore.config.reference > docs/config.md`` writes the reference;
:func:`explain` answers ``rlcore config explain KEY``.
"""

from __future__ import annotations

import difflib
import sys
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path as FilePath
from typing import Any, Literal, Union, get_args, get_origin

import attrs

from rlcore.config.dump import format_value
from rlcore.config.schema import RunConfig
from rlcore.errors import ConfigError, PluginError
from rlcore.interfaces.config_key import Seconds

if typing.TYPE_CHECKING:
    from rlcore.plugins import PluginRegistry

__all__ = [
    "SLOTS",
    "KeyDoc",
    "Slot",
    "core_keys",
    "explain",
    "keys_without_help",
    "main",
    "plugin_keys",
    "render_markdown",
]

ROLE_NAME = "<name>"  # [roles.<name>]: any role name


@attrs.frozen(kw_only=True)
class Slot:
    """Where one plugin kind's ``Config`` keys sit in a run's TOML."""

    kind: str
    table: str  # "{name}" is the plugin's name (``reward.options.{name}``)
    selected_by: str  # the key that names the plugin
    default: str | None  # the plugin used when that key is absent
    also: tuple[str, ...] = ()  # other tables that take the same options


SLOTS: tuple[Slot, ...] = (
    Slot(
        kind="engine",
        table="actor.engine",
        selected_by="actor.engine.name",
        default="fsdp2",
        also=("ref.engine", "critic.engine", f"roles.{ROLE_NAME}.engine"),
    ),
    Slot(kind="rollout", table="rollout", selected_by="rollout.name", default="hf"),
    Slot(kind="algorithm", table="algorithm", selected_by="algorithm.name", default="grpo"),
    Slot(
        kind="reward",
        table="reward.options.{name}",
        selected_by="reward.default / reward.sources",
        default=None,
    ),
    Slot(
        kind="tool",
        table="agent.options.{name}",
        selected_by="agent.tools",
        default=None,
    ),
    Slot(
        kind="logger",
        table="trainer.logger_options.{name}",
        selected_by="trainer.loggers",
        default=None,
    ),
)


@attrs.frozen(kw_only=True)
class KeyDoc:
    """One key of a run's TOML."""

    key: str  # dotted path: actor.optim.lr
    type: str  # in TOML's words: integer, float, string, boolean, array of string, table
    default: str  # TOML syntax, "required", "unset", or the key it is resolved from
    allowed: str  # "" when any value of the type is accepted
    help: str  # "" when the field has none (keys_without_help reports it)
    table: str  # the TOML table it sits in: actor.optim
    owner: str  # "rlcore" or "<kind> <name> (<distribution>)"


# --- types -------------------------------------------------------------------------------------

_SCALARS = {int: "integer", float: "float", str: "string", bool: "boolean"}


def _hints(cls: type) -> dict[str, Any]:
    """The field types of ``cls``, resolved where they can be (strings otherwise)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a name only imported under TYPE_CHECKING: keep the text
        return {f.name: f.type for f in attrs.fields(cls)}


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _members(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if _is_union(tp) else (tp,)


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """``(tp without None, whether None was allowed)``."""
    members = _members(tp)
    rest = tuple(m for m in members if m is not type(None))
    if len(rest) == len(members):
        return tp, False
    return (rest[0] if len(rest) == 1 else Union[rest]), True  # noqa: UP007


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    if tp is Any:
        return "any"
    tp, _ = _strip_none(tp)
    if _is_union(tp):
        return " or ".join(_type_name(m) for m in get_args(tp))
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin = get_origin(tp)
    if origin is Literal:
        kinds = {type(a) for a in get_args(tp)}
        return " or ".join(sorted(_SCALARS.get(k, k.__name__) for k in kinds))
    if origin is tuple:
        args = [a for a in get_args(tp) if a is not Ellipsis]
        inner = {_type_name(a) for a in args}
        return "array of " + " or ".join(sorted(inner)) if inner else "array"
    if origin in (dict, Mapping):
        _, value = get_args(tp)
        return "table" if value is Any else f"table of {_type_name(value)}"
    if attrs.has(tp):
        return "table"
    return getattr(tp, "__name__", str(tp))


def _table_class(tp: Any) -> type | None:
    """The attrs class of a field that is a table of keys (``optim``, ``val``), else None."""
    tp, _ = _strip_none(tp)
    return tp if isinstance(tp, type) and attrs.has(tp) else None


def _named_tables(tp: Any) -> type | None:
    """The attrs class of ``dict[str, Class]`` (``[roles.<name>]``), else None."""
    if get_origin(tp) in (dict, Mapping):
        _, value = get_args(tp)
        return value if isinstance(value, type) and attrs.has(value) else None
    return None


# --- allowed values ----------------------------------------------------------------------------

# Validators written as functions that say which plugin names they accept (module, name).
_NAME_VALIDATORS: dict[tuple[str, str], str] = {
    ("rlcore.rl.algorithm", "policy_loss_name"): "policy_loss",
    ("rlcore.rl.algorithm", "adv_estimator_name"): "adv_estimator",
    ("rlcore.config.trainer_section", "_loggers"): "logger",
}
_TEXT_VALIDATORS: dict[tuple[str, str], str] = {
    ("rlcore.config.fields", "_nonempty"): "not empty",
}


def _validators(validator: Any) -> Iterator[tuple[Any, bool]]:
    """Every leaf validator, with whether it sits under ``optional``."""
    stack = [(validator, False)]
    while stack:
        item, optional = stack.pop(0)
        if item is None:
            continue
        if isinstance(item, list | tuple):
            stack[:0] = [(v, optional) for v in item]
        elif hasattr(item, "_validators"):  # and_
            stack[:0] = [(v, optional) for v in item._validators]
        elif type(item).__name__ == "_OptionalValidator":
            stack.insert(0, (item.validator, True))
        else:
            yield item, optional


def _allowed(
    field: attrs.Attribute[Any], tp: Any, registry: PluginRegistry | None, plugin_names: bool
) -> str:
    if "allowed" in field.metadata:
        return str(field.metadata["allowed"])
    parts: list[str] = []
    optional = False
    for validator, under_optional in _validators(field.validator):
        optional = optional or under_optional
        kind = type(validator).__name__
        if kind == "_InValidator":
            parts.append("one of " + ", ".join(format_value(o) for o in validator.options))
        elif kind == "_NumberValidator":
            parts.append(f"{validator.compare_op} {format_value(validator.bound)}")
        elif isinstance(validator, Seconds):
            parts.append(validator.allowed)
        else:
            key = (getattr(validator, "__module__", ""), getattr(validator, "__qualname__", ""))
            if key in _TEXT_VALIDATORS:
                parts.append(_TEXT_VALIDATORS[key])
            elif key in _NAME_VALIDATORS:
                plugin_kind = _NAME_VALIDATORS[key]
                names = _plugin_names(registry, plugin_kind) if plugin_names else []
                listed = f": {', '.join(names)}" if names else ""
                parts.append(f"an installed {plugin_kind} plugin{listed}")
    bare, _ = _strip_none(tp)
    if not any(p.startswith("one of") for p in parts) and get_origin(bare) is Literal:
        parts.insert(0, "one of " + ", ".join(format_value(a) for a in get_args(bare)))
    text = ", ".join(dict.fromkeys(parts))
    if text and optional:
        text += " (or unset)"
    return text


def _plugin_names(registry: PluginRegistry | None, kind: str) -> list[str]:
    if registry is None:
        return []
    try:
        return registry.names(kind)
    except PluginError:
        return []


# --- defaults ----------------------------------------------------------------------------------


def _default_value(field: attrs.Attribute[Any]) -> Any:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return attrs.NOTHING
        # Validators off: a default table is read, not checked (SandboxOptions' validator
        # starts a sandbox).
        with attrs.validators.disabled():
            return default.factory()
    return default


def _default_text(field: attrs.Attribute[Any], value: Any) -> str:
    if "default" in field.metadata:
        return str(field.metadata["default"])
    if value is attrs.NOTHING:
        return "required"
    if value is None:
        return "unset"
    try:
        return format_value(value)
    except TypeError:
        return repr(value)


# --- walking a class ---------------------------------------------------------------------------


def _walk(
    cls: type,
    table: str,
    owner: str,
    registry: PluginRegistry | None,
    defaults: Any = None,
    inherited_default: str | None = None,
    plugin_names: bool = True,
) -> Iterator[KeyDoc]:
    hints = _hints(cls)
    for field in attrs.fields(cls):
        if field.metadata.get("flatten"):
            continue  # a plugin's options: documented per plugin (SLOTS)
        tp = hints.get(field.name, field.type)
        key = f"{table}.{field.name}" if table else field.name
        value = getattr(defaults, field.name) if defaults is not None else _default_value(field)
        sub = _table_class(tp)
        if sub is not None:
            resolved = field.metadata.get("default")
            sub_defaults = value if isinstance(value, sub) else None
            yield from _walk(
                sub, key, owner, registry, sub_defaults, resolved or inherited_default, plugin_names
            )
            continue
        named = _named_tables(tp)
        if named is not None:
            yield from _walk(
                named, f"{key}.{ROLE_NAME}", owner, registry, plugin_names=plugin_names
            )
            continue
        default = _default_text(field, value)
        if default == "required" and inherited_default:
            default = f"{inherited_default}.{field.name}"
        yield KeyDoc(
            key=key,
            type=_type_name(tp),
            default=default,
            allowed=_allowed(field, tp, registry, plugin_names),
            help=" ".join(str(field.metadata.get("help", "")).split()),
            table=table,
            owner=owner,
        )


def core_keys(registry: PluginRegistry | None = None) -> list[KeyDoc]:
    """Every key of the core's sections, in :class:`RunConfig` order."""
    return list(_walk(RunConfig, "", "rlcore", registry))


def _owner(kind: str, name: str, registry: PluginRegistry) -> str:
    entry = registry.entry(kind, name)
    dist = entry.distribution if entry is not None else None
    return f"{kind} {name}" + (f" ({dist})" if dist else "")


def plugin_keys(
    registry: PluginRegistry, kind: str, name: str, *, table: str | None = None
) -> list[KeyDoc]:
    """The keys of plugin ``name``'s ``Config``, under ``table`` (default: its slot's table)."""
    slot = next(s for s in SLOTS if s.kind == kind)
    cls = registry.resolve(kind, name)
    where = (table or slot.table).format(name=name)
    owner = _owner(kind, name, registry)
    return list(_walk(cls.Config, where, owner, registry))  # type: ignore[attr-defined]


def _installed(registry: PluginRegistry, kind: str) -> list[str]:
    return _plugin_names(registry, kind)


def _keys_or_none(
    registry: PluginRegistry, kind: str, name: str, table: str | None = None
) -> list[KeyDoc]:
    """:func:`plugin_keys`, or none for a plugin that cannot be imported here."""
    try:
        return plugin_keys(registry, kind, name, table=table)
    except PluginError:
        return []


def keys_without_help(registry: PluginRegistry) -> list[str]:
    """``owner: key`` for every key of the core and of each installed plugin without help."""
    docs = core_keys(registry)
    for slot in SLOTS:
        for name in _installed(registry, slot.kind):
            docs.extend(plugin_keys(registry, slot.kind, name))
    return [f"{d.owner}: {d.key}" for d in docs if not d.help]


# --- the Markdown reference --------------------------------------------------------------------

_HEADER = """\
# Configuration reference

<!-- Generated by `python -m rlcore.config.reference > docs/config.md` from the attrs
fields of the schema and of the installed plugins' Config classes; do not edit by hand
(tests/test_config_reference.py fails when this file is stale). -->

Every key of a run's TOML file: its type, its default, the values it accepts and what it
does. Any key can also be set on the command line (`KEY=VALUE`, the value parsed as TOML),
and `rlcore config explain KEY` prints one entry. `rlcore config show CONFIG` prints a
config with every default filled in.

A plugin-selected table (`[actor.engine]`, `[rollout]`, `[algorithm]`,
`[reward.options.NAME]`, `[trainer.logger_options.NAME]`) takes, next to the core's keys,
the options of the plugin it selects; they are listed per installed plugin in the second
part. Defaults written as a key name (`model.path`) are resolved from that key.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def _code(text: str) -> str:
    return f"`{text}`" if text else " "


def _table(docs: Sequence[KeyDoc]) -> list[str]:
    lines = ["| key | type | default | allowed | effect |", "|---|---|---|---|---|"]
    for d in docs:
        key = d.key
        default = d.default if d.default in ("required", "unset") else _code(d.default)
        lines.append(
            f"| `{_cell(key)}` | {_cell(d.type)} | {_cell(default)} | {_cell(d.allowed)} "
            f"| {_cell(d.help)} |"
        )
    return lines


def _section_doc(cls: type) -> str:
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.replace("``", "`").split())


def _sections() -> list[tuple[str, type]]:
    hints = _hints(RunConfig)
    out = []
    for field in attrs.fields(RunConfig):
        tp = hints[field.name]
        cls = _table_class(tp) or _named_tables(tp)
        if cls is not None:
            name = field.name if _table_class(tp) else f"{field.name}.{ROLE_NAME}"
            out.append((name, cls))
    return out


def render_markdown(registry: PluginRegistry) -> str:
    """docs/config.md: the core's sections, then each installed plugin's options."""
    lines = [_HEADER, "## Core sections", ""]
    docs = core_keys(registry)
    for section, cls in _sections():
        mine = [d for d in docs if d.key.startswith(f"{section}.")]
        lines += [f"### `[{section}]`", "", _section_doc(cls), ""]
        lines += [*_table(mine), ""]
    lines += ["## Plugin options", ""]
    for slot in SLOTS:
        names = _installed(registry, slot.kind)
        if not names:
            continue
        table = slot.table.format(name="NAME")
        lines += [f"### `[{table}]`: {slot.kind} plugins", ""]
        text = f"Selected by `{slot.selected_by}`"
        text += f" (default `{slot.default}`)." if slot.default else "."
        if slot.also:
            text += " The same options go in " + ", ".join(f"`[{t}]`" for t in slot.also)
            text += " (each defaults to the actor's engine)."
        lines += [text, ""]
        for name in names:
            lines += [f"#### {_owner(slot.kind, name, registry)}", ""]
            try:
                cls = registry.resolve(slot.kind, name)
            except PluginError as err:
                lines += [f"Not documented: {err}", ""]
                continue
            mine = plugin_keys(registry, slot.kind, name)
            summary = _section_doc(cls.Config) or _section_doc(cls)  # type: ignore[attr-defined]
            if summary:
                lines += [summary, ""]
            lines += [*_table(mine), ""] if mine else ["No options.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


# --- rlcore config explain KEY -----------------------------------------------------------------


def _selected(raw: Mapping[str, Any], dotted: str, default: str | None) -> str | None:
    node: Any = raw
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, str) else default


def _normalise(key: str) -> str:
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "roles":
        parts[1] = ROLE_NAME
    return ".".join(parts)


def _engine_tables(key: str) -> tuple[str, str] | None:
    """``(table, engine-name key)`` when ``key`` sits in an engine table."""
    parts = key.split(".")
    for n in (1, 2):
        if len(parts) > n + 1 and parts[n] == "engine" and (n == 1 or parts[0] == "roles"):
            table = ".".join(parts[: n + 1])
            return table, f"{table}.name"
    return None


def _relevant(table: str, key: str) -> bool:
    """Whether ``key`` is in ``table`` or is ``table`` or one of the tables around it."""
    return key == table or key.startswith(f"{table}.") or table.startswith(f"{key}.")


def _candidates(raw: Mapping[str, Any], key: str, registry: PluginRegistry) -> list[KeyDoc]:
    """The core's keys and, for the table ``key`` is in, the keys of the plugin the config
    selects (or the default one); only those plugins are imported."""
    docs = core_keys(registry)
    for slot in SLOTS:
        if slot.kind == "engine":
            actor = _selected(raw, slot.selected_by, slot.default)
            tables = [(slot.table, actor)]
            found = _engine_tables(key)
            if found is not None and found[0] != slot.table:
                tables.append((found[0], _selected(raw, found[1], actor)))
            for table, name in tables:
                if not _relevant(table, key):
                    continue
                if name is not None and name in _installed(registry, "engine"):
                    docs.extend(_keys_or_none(registry, "engine", name, table))
        elif slot.default is not None:
            name = _selected(raw, slot.selected_by, slot.default)
            if not _relevant(slot.table, key):
                continue
            if name is not None and name in _installed(registry, slot.kind):
                docs.extend(_keys_or_none(registry, slot.kind, name))
        else:  # rewards and loggers: the key names the one it means
            for name in _installed(registry, slot.kind):
                if _relevant(slot.table.format(name=name), key):
                    docs.extend(_keys_or_none(registry, slot.kind, name))
    return docs


def _other_plugins(key: str, raw: Mapping[str, Any], registry: PluginRegistry) -> list[str]:
    """``kind name`` of the installed plugins, not selected, that have ``key``."""
    found = []
    for slot in SLOTS:
        if slot.default is None:
            continue
        table = slot.table
        engine = _engine_tables(key) if slot.kind == "engine" else None
        if engine is not None:
            table = engine[0]
        if not key.startswith(f"{table}."):
            continue
        for name in _installed(registry, slot.kind):
            if any(d.key == key for d in _keys_or_none(registry, slot.kind, name, table)):
                found.append(f"{slot.kind} {name}")
    return found


def _selected_in(raw: Mapping[str, Any], key: str) -> str:
    """``kind name`` of the plugin the config selects for the table ``key`` sits in."""
    for slot in SLOTS:
        if slot.default is None:
            continue
        engine = _engine_tables(key) if slot.kind == "engine" else None
        table, name_key = engine or (slot.table, slot.selected_by)
        if key.startswith(f"{table}."):
            actor = _selected(raw, "actor.engine.name", slot.default)
            name = _selected(raw, name_key, actor if slot.kind == "engine" else slot.default)
            return f"{slot.kind} {name}"
    return ""


def _describe(d: KeyDoc) -> str:
    lines = [d.key, f"  type:     {d.type}", f"  default:  {d.default}"]
    if d.allowed:
        lines.append(f"  allowed:  {d.allowed}")
    lines.append(f"  defined by: {d.owner}")
    lines.append(f"  effect:   {d.help or '(no help text)'}")
    return "\n".join(lines) + "\n"


def explain(
    key: str,
    *,
    config: str | FilePath | None = None,
    registry: PluginRegistry | None = None,
) -> str:
    """What ``rlcore config explain KEY`` prints; :class:`ConfigError` (one line) for an
    unknown key, naming the nearest known keys."""
    from rlcore.config.loader import read_toml
    from rlcore.plugins import default_registry

    registry = registry or default_registry()
    raw = read_toml(config) if config is not None else {}
    key = key.strip()
    wanted = _normalise(key)
    docs = _candidates(raw, wanted, registry)
    for d in docs:
        if d.key == wanted:
            return _describe(d)
    inside = [d for d in docs if d.key.startswith(f"{wanted}.")]
    if inside:  # a table: list its keys
        names = ", ".join(d.key.removeprefix(f"{wanted}.") for d in inside)
        return f"{key}: a table; its keys: {names}\n"
    others = _other_plugins(wanted, raw, registry)
    if others:
        where = f"in {config}" if config is not None else "by default"
        selected = _selected_in(raw, wanted)
        msg = f"{key} is an option of {', '.join(others)}, not of the plugin selected {where}" + (
            f" ({selected})" if selected else ""
        )
        raise ConfigError(msg)
    every = {d.key for d in docs}
    for slot in SLOTS:
        for name in _installed(registry, slot.kind):
            every.update(d.key for d in _keys_or_none(registry, slot.kind, name))
    close = difflib.get_close_matches(wanted, sorted(every), n=3, cutoff=0.6)
    if not close:  # the last part alone: lr -> actor.optim.lr, critic.optim.lr
        last = wanted.rsplit(".", 1)[-1]
        tails = {k.rsplit(".", 1)[-1]: k for k in sorted(every, reverse=True)}
        close = [
            k
            for t in difflib.get_close_matches(last, list(tails), n=3, cutoff=0.75)
            for k in sorted(every)
            if k.endswith(f".{t}")
        ][:3]
    if not close:  # a spelled-out abbreviation: learning_rate -> actor.optim.lr, ...
        initials = "".join(w[:1] for w in wanted.rsplit(".", 1)[-1].split("_"))
        close = [k for k in sorted(every) if len(initials) > 1 and k.endswith(f".{initials}")]
        close = close[:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    msg = f"unknown config key {key!r}{hint}"
    raise ConfigError(msg)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlcore.config.reference``: the Markdown reference on stdout."""
    from rlcore.plugins import default_registry

    del argv
    sys.stdout.write(render_markdown(default_registry()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
