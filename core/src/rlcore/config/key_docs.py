"""Every config key with its type, default, allowed values and effect, read from its declaration.

One source of truth per key: the attrs field itself. Its type and default are the field's;
its allowed values come from its validators (``in_``, ``ge``/``gt``/``le``/``lt``,
``optional``) or a ``Literal`` type; its effect is ``metadata={"help": "..."}``. Two more
metadata keys, both optional: ``"default"`` (text) for a key whose default is resolved from
other keys (``model.tokenizer_path``: ``model.path``), and ``"allowed"`` (text) for a
validator written as a function.

The core's sections come from :class:`~rlcore.config.schema.RunConfig`; each installed
plugin's ``Config`` is read where its keys sit in a run's TOML (:data:`SLOTS`)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Union, get_args, get_origin

import attrs

from rlcore.config.dump import format_value
from rlcore.config.schema import RunConfig
from rlcore.errors import PluginError
from rlcore.interfaces.config_key import Seconds

if typing.TYPE_CHECKING:
    from rlcore.plugins import PluginRegistry


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


def class_hints(cls: type) -> dict[str, Any]:
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


def table_class(tp: Any) -> type | None:
    """The attrs class of a field that is a table of keys (``optim``, ``val``), else None."""
    tp, _ = _strip_none(tp)
    return tp if isinstance(tp, type) and attrs.has(tp) else None


def named_tables_class(tp: Any) -> type | None:
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
    hints = class_hints(cls)
    for field in attrs.fields(cls):
        if field.metadata.get("flatten"):
            continue  # a plugin's options: documented per plugin (SLOTS)
        tp = hints.get(field.name, field.type)
        key = f"{table}.{field.name}" if table else field.name
        value = getattr(defaults, field.name) if defaults is not None else _default_value(field)
        sub = table_class(tp)
        if sub is not None:
            resolved = field.metadata.get("default")
            sub_defaults = value if isinstance(value, sub) else None
            yield from _walk(
                sub, key, owner, registry, sub_defaults, resolved or inherited_default, plugin_names
            )
            continue
        named = named_tables_class(tp)
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


def owner_of(kind: str, name: str, registry: PluginRegistry) -> str:
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
    owner = owner_of(kind, name, registry)
    return list(_walk(cls.Config, where, owner, registry))  # type: ignore[attr-defined]


def installed_names(registry: PluginRegistry, kind: str) -> list[str]:
    return _plugin_names(registry, kind)


def keys_or_none(
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
        for name in installed_names(registry, slot.kind):
            docs.extend(plugin_keys(registry, slot.kind, name))
    return [f"{d.owner}: {d.key}" for d in docs if not d.help]
