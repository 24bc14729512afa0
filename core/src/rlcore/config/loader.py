"""TOML file + command-line overrides -> a validated, fully resolved :class:`RunConfig`.

Order of work, so that one run reports every error it can: apply overrides, take the
plugin-owned keys out of their tables, structure each core section on its own, validate each
selected plugin's keys with that plugin's ``Config``, then check cross-key rules. Only a
config without any error gets its defaults resolved.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path as FilePath
from typing import Any

import attrs

from rlcore.config.convert import Path, Problem, render_path, structure, unknown_key
from rlcore.config.cross_key_rules import cross_key_problems
from rlcore.config.fields import ROLES
from rlcore.config.resolve_defaults import (
    DEFAULT_MAX_TOKENS_PER_MICRO_BATCH as DEFAULT_MAX_TOKENS_PER_MICRO_BATCH,
)
from rlcore.config.resolve_defaults import resolved_config
from rlcore.config.schema import (
    ActorConfig,
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    PluginsConfig,
    PluginSection,
    RefConfig,
    ResourcesConfig,
    RewardConfig,
    RewardModelConfig,
    RoleConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
)
from rlcore.config.toml_input import apply_overrides, parse_toml, read_toml
from rlcore.errors import ConfigError, PluginError
from rlcore.plugins import PluginRegistry, active_registry, default_registry

__all__ = [
    "ConfigValidationError",
    "apply_overrides",
    "build_config",
    "load_config",
    "load_config_text",
    "read_toml",
    "validate",
]

_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "actor": ActorConfig,
    "rollout": RolloutConfig,
    "ref": RefConfig,
    "critic": CriticConfig,
    "reward": RewardConfig,
    "algorithm": AlgorithmConfig,
    "trainer": TrainerConfig,
    "resources": ResourcesConfig,
    "plugins": PluginsConfig,
    "agent": AgentConfig,
    "reward_model": RewardModelConfig,
}
_ROLLOUT_CORE_KEYS = frozenset(f.name for f in attrs.fields(RolloutConfig)) - {"options"}
_DEFAULT_ENGINE = "fsdp2"
_DEFAULT_ROLLOUT = "hf"
_DEFAULT_ALGORITHM = "grpo"


class ConfigValidationError(ConfigError):
    """Every problem of one config, one line each (``key.path: what is wrong``)."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = tuple(errors)
        if len(self.errors) == 1:
            text = f"{source}: {self.errors[0]}"
        else:
            text = f"{source}: {len(self.errors)} errors\n" + "\n".join(
                f"  {e}" for e in self.errors
            )
        super().__init__(text)


# --- plugin-owned keys ------------------------------------------------------------------------


@attrs.frozen
class _Choice:
    """A plugin selected by a section, with the keys its ``Config`` must accept."""

    kind: str
    name: Any  # a str unless the user wrote something else (then the core reports it)
    options: Any
    path: Path  # where the options live
    name_path: Path  # where the name was (or would be) written
    candidates: frozenset[str] = frozenset({"name"})


def _take_engine(
    raw: dict[str, Any], section: str, default: Any, where: Path | None = None
) -> _Choice | None:
    table = raw.get(section) if default is None else raw.setdefault(section, {})
    if not isinstance(table, dict) or ("engine" not in table and default is None):
        return None
    engine = table.get("engine", {})
    if not isinstance(engine, dict):
        return None  # reported by the core: "expected a table"
    name = engine.get("name", default)
    table["engine"] = {"name": name}
    options = {k: v for k, v in engine.items() if k != "name"}
    path = (*(where or (section,)), "engine")
    return _Choice("engine", name, options, path, (*path, "name"))


def _roles(raw: Any) -> tuple[dict[str, RoleConfig], list[Problem]]:
    """``[roles.<name>]`` tables, each a :class:`RoleConfig` (its engine typed later)."""
    if not isinstance(raw, dict):
        return {}, [((ROLES,), "expected a table of [roles.NAME]")]
    roles: dict[str, RoleConfig] = {}
    problems: list[Problem] = []
    for name, table in raw.items():
        role, found = structure(table, RoleConfig, (ROLES, name))
        problems.extend(found)
        if role is not None:
            roles[name] = role
    return roles, problems


def _take_named(raw: dict[str, Any], section: str, kind: str, default: str) -> _Choice | None:
    table = raw.setdefault(section, {})
    if not isinstance(table, dict):
        return None
    core = _ROLLOUT_CORE_KEYS if section == "rollout" else frozenset({"name"})
    name = table.get("name", default)
    options = {k: v for k, v in table.items() if k not in core}
    raw[section] = {k: v for k, v in table.items() if k in core}
    return _Choice(kind, name, options, (section,), (section, "name"), core)


def _extract_choices(
    raw: dict[str, Any],
) -> tuple[list[_Choice], dict[str, dict[str, Any]], list[Problem]]:
    choices = []
    actor = _take_engine(raw, "actor", _DEFAULT_ENGINE)
    if actor is not None:
        choices.append(actor)
    actor_name = actor.name if actor is not None else _DEFAULT_ENGINE
    owners: list[tuple[dict[str, Any], str, Path]] = [
        (raw, section, (section,)) for section in ("ref", "critic", "reward_model")
    ]
    roles = raw.get(ROLES)
    if isinstance(roles, dict):
        owners += [(roles, name, (ROLES, name)) for name in roles]
    for table, section, where in owners:
        # Without its own [ref.engine] / [critic.engine], the role uses the actor's engine.
        choice = _take_engine(table, section, None, where)
        if choice is not None:
            if "name" not in table[section]["engine"] or choice.name is None:
                choice = attrs.evolve(choice, name=actor_name)
                table[section]["engine"] = {"name": actor_name}
            choices.append(choice)
    for section, kind, default in (
        ("rollout", "rollout", _DEFAULT_ROLLOUT),
        ("algorithm", "algorithm", _DEFAULT_ALGORITHM),
    ):
        choice = _take_named(raw, section, kind, default)
        if choice is not None:
            choices.append(choice)
    problems: list[Problem] = []
    given = {
        section: _take_options(raw, section, key, problems)
        for section, key in (
            ("reward", "options"),
            ("trainer", "logger_options"),
            ("agent", "options"),
        )
    }
    return choices, given, problems


def _take_options(
    raw: dict[str, Any], section: str, key: str, problems: list[Problem]
) -> dict[str, Any]:
    """Pop ``[section.key.NAME]`` tables (plugin options the registry must type first)."""
    table = raw.get(section)
    if not isinstance(table, dict) or key not in table:
        return {}
    given = table.pop(key)
    if isinstance(given, dict):
        return given
    problems.append(((section, key), f"expected a table of [{section}.{key}.NAME]"))
    return {}


def _resolve(
    registry: PluginRegistry, kind: str, name: Any, name_path: Path
) -> tuple[type | None, list[Problem]]:
    if not isinstance(name, str):
        return None, []
    try:
        return registry.resolve(kind, name), []
    except PluginError as err:
        return None, [(name_path, str(err))]


def _plugin_config(
    registry: PluginRegistry, choice: _Choice, off_policy_rollout: bool
) -> tuple[Any, list[Problem]]:
    cls, problems = _resolve(registry, choice.kind, choice.name, choice.name_path)
    if cls is None:
        return None, problems
    config_cls: type = cls.Config  # type: ignore[attr-defined]
    options = choice.options
    if choice.kind == "algorithm" and off_policy_rollout:
        options = _default_rollout_is(options, config_cls)
    return structure(options, config_cls, choice.path, choice.candidates)


#: ``algorithm.rollout_is`` when the rollout's samples are not the policy's own and the config
#: leaves it unset (:func:`_off_policy_rollout`). In the asynchronous modes, without the
#: correction the quickstart's one-step-off and fully-async runs ended 2-19 points under the
#: synchronous run of the same seed; with it their means over 3 seeds were 1.2 and 2.2 points
#: under (docs/placement.md, "Measured on the quickstart"). A bfloat16 rollout engine for a
#: float32 policy samples from a rounded policy (|rollout - trainer| log-prob ~2e-3 on the
#: quickstart, README "vLLM against HF"): the same correction, as verl's truncated IS.
DEFAULT_ROLLOUT_IS = "token"


def _off_policy_rollout(
    trainer: TrainerConfig | None, model: ModelConfig | None, choices: list[_Choice]
) -> bool:
    """Whether the rollout samples from other weights than the policy's: an asynchronous
    ``trainer.async_mode`` (older versions), or a rollout plugin's ``dtype`` option set to
    another dtype than ``model.dtype`` (vLLM's bfloat16 engine for a float32 policy)."""
    if trainer is not None and trainer.async_mode != "off":
        return True
    rollout = next((c for c in choices if c.kind == "rollout" and c.path == ("rollout",)), None)
    if model is None or rollout is None or not isinstance(rollout.options, dict):
        return False
    dtype = rollout.options.get("dtype")
    return isinstance(dtype, str) and dtype != model.dtype


def _default_rollout_is(options: Any, config_cls: type) -> Any:
    """The algorithm's options with ``rollout_is`` = :data:`DEFAULT_ROLLOUT_IS` when its
    ``Config`` has the key and the config left it unset; an explicit value (``"none"``
    included) is kept."""
    if not isinstance(options, dict) or "rollout_is" in options:
        return options
    if "rollout_is" not in attrs.fields_dict(config_cls):
        return options
    return {**options, "rollout_is": DEFAULT_ROLLOUT_IS}


def _reward_configs(
    registry: PluginRegistry, reward: RewardConfig | None, given: dict[str, Any]
) -> tuple[dict[str, Any], list[Problem]]:
    wanted: dict[str, Path] = {}  # name -> where it was first selected
    if reward is not None:
        for name in reward.default:
            wanted.setdefault(name, ("reward", "default"))
        for source, names in reward.sources.items():
            for name in names:
                wanted.setdefault(name, ("reward", "sources", source))
    for name in given:
        wanted.setdefault(name, ("reward", "options", name))
    return _named_configs(registry, "reward", wanted, given, ("reward", "options"))


def _named_configs(
    registry: PluginRegistry,
    kind: str,
    wanted: Mapping[str, Path],
    given: Mapping[str, Any],
    options_path: Path,
) -> tuple[dict[str, Any], list[Problem]]:
    """Each wanted plugin name's ``Config``, typed from its options table (or defaults)."""
    problems: list[Problem] = []
    configs: dict[str, Any] = {}
    for name, where in wanted.items():
        cls, found = _resolve(registry, kind, name, where)
        problems.extend(found)
        if cls is None:
            continue
        table = given.get(name, {})
        path: Path = (*options_path, name)
        if not isinstance(table, dict):
            problems.append((path, "expected a table"))
            continue
        config, found = structure(table, cls.Config, path)  # type: ignore[attr-defined]
        problems.extend(found)
        configs[name] = config
    return configs, problems


def _selected(
    kind: str, names: Sequence[str], at: Path, given: dict[str, Any], options_path: Path
) -> tuple[dict[str, Path], Problem | None]:
    """Each selected name (``names``, the list at ``at``) with where it is selected, and the
    first options table in ``given`` (at ``options_path``) for a name the list does not select."""
    wanted: dict[str, Path] = {}
    for i, name in enumerate(names):
        wanted.setdefault(name, (*at, i))
    for name in given:
        if name not in wanted:
            msg = f"options for {kind} {name!r}, which [{at[0]}] {at[1]} does not select"
            return wanted, ((*options_path, name), msg)
    return wanted, None


def _logger_configs(
    registry: PluginRegistry, trainer: TrainerConfig | None, given: dict[str, Any]
) -> tuple[dict[str, Any], list[Problem]]:
    names = trainer.loggers if trainer is not None else ()
    options: Path = ("trainer", "logger_options")
    wanted, problem = _selected("logger", names, ("trainer", "loggers"), given, options)
    if problem is not None:
        return {}, [problem]
    return _named_configs(registry, "logger", wanted, given, options)


# --- rules across keys ------------------------------------------------------------------------


def _tool_configs(
    registry: PluginRegistry, agent: AgentConfig | None, given: dict[str, Any]
) -> tuple[dict[str, Any], list[Problem]]:
    """Each ``[agent] tools`` name's ``Config``, typed from ``[agent.options.NAME]`` (its
    defaults when absent): the name must resolve to an installed tool plugin and its options
    validate (a tool's validator may check what it needs, e.g. a sandbox binary), so that the
    workers do not find out after Ray started."""
    names = agent.tools if agent is not None else ()
    # The harness and the environment take [agent.options.NAME] too (issue 46).
    kinds = {name: ("tool", "tools") for name in names}
    for kind in ("harness", "environment"):
        chosen = getattr(agent, kind, None) if agent is not None else None
        if chosen is not None:
            kinds.setdefault(chosen, (kind, kind))
    wanted, problem = _selected("tool", names, ("agent", "tools"), {
        k: v for k, v in given.items() if k in names or k not in kinds
    }, ("agent", "options"))  # fmt: skip
    if problem is not None:
        return {}, [problem]
    for name, (_kind, at) in kinds.items():
        wanted.setdefault(name, ("agent", at))
    problems: list[Problem] = []
    configs: dict[str, Any] = {}
    for name, where in wanted.items():
        kind, at = kinds[name]
        try:
            cls = registry.resolve(kind, name, where=f"[agent] {at}")
        except PluginError as err:
            problems.append((where, str(err)))
            continue
        if name not in given:  # defaults: a problem is the tool's, named where it is selected
            config, found = structure({}, cls.Config, where)  # type: ignore[attr-defined]
            problems.extend((where, f"{kind} {name!r}: {msg}") for _, msg in found)
        elif isinstance(given[name], dict):
            path: Path = ("agent", "options", name)
            config, found = structure(given[name], cls.Config, path)  # type: ignore[attr-defined]
            problems.extend(found)
        else:
            problems.append((("agent", "options", name), "expected a table"))
            continue
        configs[name] = config
    return configs, problems


# --- entry points -----------------------------------------------------------------------------


def build_config(
    raw: Mapping[str, Any],
    *,
    source: str = "<config>",
    overrides: Sequence[str] = (),
    registry: PluginRegistry | None = None,
) -> RunConfig:
    """Validate parsed TOML data; raise :class:`ConfigValidationError` listing every problem."""
    data: dict[str, Any] = copy.deepcopy(dict(raw))
    lines = apply_overrides(data, overrides)
    if registry is None:  # [plugins] disabled decides which entry points are imported at all
        registry = default_registry(_disabled_plugins(data))
    # Validators inside plugin Configs (a policy-loss name, say) resolve with this registry.
    with active_registry(registry):
        return _build_config(data, source, lines, registry)


def _build_config(
    data: dict[str, Any], source: str, lines: list[str], registry: PluginRegistry
) -> RunConfig:
    problems: list[Problem] = [
        ((key,), unknown_key(key, [*_SECTIONS, ROLES], "section"))
        for key in data
        if key not in _SECTIONS and key != ROLES
    ]
    choices, given, found = _extract_choices(data)
    problems.extend(found)

    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        sections[name], found = structure(data.get(name, {}), cls, (name,))
        problems.extend(found)
    if "agent" not in data:
        sections["agent"] = None  # no [agent] section: single-turn generation
    sections[ROLES], found = _roles(data.get(ROLES, {}))
    problems.extend(found)
    tool_configs, found = _tool_configs(registry, sections["agent"], given["agent"])
    problems.extend(found)

    # Each selected plugin validates its own keys, even where a core key was wrong.
    off_policy = _off_policy_rollout(sections["trainer"], sections["model"], choices)
    for choice in choices:
        options, found = _plugin_config(registry, choice, off_policy)
        problems.extend(found)
        owner_key = str(choice.path[0])
        owner = sections.get(owner_key)
        if owner is None or options is None:
            continue
        if owner_key == ROLES:  # [roles.<name>.engine]
            name = str(choice.path[1])
            if name in owner:
                section = PluginSection(name=choice.name, options=options)
                owner[name] = attrs.evolve(owner[name], engine=section)
            continue
        if choice.path[-1] == "engine":
            section = PluginSection(name=choice.name, options=options)
            sections[owner_key] = attrs.evolve(owner, engine=section)
        else:
            sections[owner_key] = attrs.evolve(owner, options=options)
    reward_configs, found = _reward_configs(registry, sections["reward"], given["reward"])
    problems.extend(found)
    logger_configs, found = _logger_configs(registry, sections["trainer"], given["trainer"])
    problems.extend(found)

    # No batch-size divisibility rules: the driver expands rows and pads every mini-batch to
    # whole rows per rank (zero-weight padding), so any sizes run; only what cannot run fails.
    problems.extend(cross_key_problems(sections))

    lines.extend(f"{render_path(p)}: {m}" if p else m for p, m in problems)
    if lines:
        raise ConfigValidationError(source, lines)
    if sections["agent"] is not None:
        sections["agent"] = attrs.evolve(sections["agent"], options=tool_configs)
    return resolved_config(sections, reward_configs, logger_configs)


def _disabled_plugins(data: Mapping[str, Any]) -> tuple[str, ...]:
    """``[plugins] disabled`` as given, before validation (which reports a bad value)."""
    table = data.get("plugins")
    names = table.get("disabled") if isinstance(table, dict) else None
    if not isinstance(names, list | tuple):
        return ()
    return tuple(n for n in names if isinstance(n, str))


def load_config_text(
    text: str,
    *,
    source: str = "<string>",
    overrides: Sequence[str] = (),
    registry: PluginRegistry | None = None,
) -> RunConfig:
    raw = parse_toml(text, source)
    return build_config(raw, source=source, overrides=overrides, registry=registry)


def load_config(
    path: str | FilePath,
    overrides: Sequence[str] = (),
    registry: PluginRegistry | None = None,
) -> RunConfig:
    """Read, override, validate and resolve the config at ``path``."""
    raw = read_toml(path)
    return build_config(raw, source=str(path), overrides=overrides, registry=registry)


def validate(
    path: str | FilePath,
    overrides: Sequence[str] = (),
    registry: PluginRegistry | None = None,
) -> tuple[str, ...]:
    """The problems of the config at ``path``, one line each; empty when it is valid."""
    try:
        load_config(path, overrides, registry)
    except ConfigValidationError as err:
        return err.errors
    except ConfigError as err:
        return (str(err),)
    return ()
