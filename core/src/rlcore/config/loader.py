"""TOML file + command-line overrides -> a validated, fully resolved :class:`RunConfig`.

Order of work, so that one run reports every error it can: apply overrides, take the
plugin-owned keys out of their tables, structure each core section on its own, validate each
selected plugin's keys with that plugin's ``Config``, then check cross-key rules. Only a
config without any error gets its defaults resolved.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path as FilePath
from typing import Any

import attrs

from rlcore.config.convert import Path, Problem, render_path, structure, unknown_key
from rlcore.config.placement_rules import placement_problems
from rlcore.config.schema import (
    BUILTIN_TOOL_TURNS,
    GLOBAL_POOL,
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
from rlcore.errors import ConfigError, PluginError
from rlcore.plugins import PluginRegistry, active_registry, default_registry
from rlcore.reward.model import RM_SCORER

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
ROLES = "roles"  # [roles.<name>]: a table of extra roles, not one section
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
    return _parse_toml(text, str(path))


def _parse_toml(text: str, source: str) -> dict[str, Any]:
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


def _micro_rule(section: str, cfg: Any) -> list[Problem]:
    if cfg.micro_batch_size is not None and cfg.max_tokens_per_micro_batch is not None:
        msg = "set micro_batch_size or max_tokens_per_micro_batch, not both"
        return [((section, "max_tokens_per_micro_batch"), msg)]
    return []


def _cross_checks(s: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    for section in ("actor", "ref", "critic", "reward_model"):
        if s.get(section) is not None:
            problems.extend(_micro_rule(section, s[section]))
    for name, role in (s.get(ROLES) or {}).items():
        problems.extend(_micro_rule(f"{ROLES}.{name}", role))
    agent: AgentConfig | None = s.get("agent")
    fixed = agent is not None and agent.turns() == "hermes"
    if agent is not None and fixed and agent.tool_parser not in BUILTIN_TOOL_TURNS:
        msg = (
            f"tool_parser {agent.tool_parser!r} has no fixed tool-turn text; set "
            'tool_turns = "chat_template" (or "auto")'
        )
        problems.append((("agent", "tool_turns"), msg))
    trainer: TrainerConfig | None = s.get("trainer")
    if trainer is not None and trainer.total_steps is not None and trainer.total_epochs:
        problems.append((("trainer", "total_steps"), "set total_steps or total_epochs, not both"))
    resources: ResourcesConfig | None = s.get("resources")
    if resources is not None:
        rm_section: RewardModelConfig | None = s.get("reward_model")
        problems.extend(
            placement_problems(
                resources,
                trainer,
                s.get("algorithm"),
                rm_enabled=rm_section is not None and rm_section.enable,
            )
        )
        mode = trainer.async_mode if trainer is not None else "off"
        if mode != "off" and resources.pool_of("rollout") == GLOBAL_POOL:
            msg = (
                f"{mode!r} needs the rollout on a pool of its own; set "
                'resources.placement.rollout = "NAME" and [resources.pools.NAME]'
            )
            problems.append((("trainer", "async_mode"), msg))
    reward: RewardConfig | None = s.get("reward")
    rm: RewardModelConfig | None = s.get("reward_model")
    rm_on = rm is not None and rm.enable
    if rm_on and rm is not None and not rm.model.path:
        msg = "reward_model.enable is true: set it to the reward model's local folder"
        problems.append((("reward_model", "model", "path"), msg))
    if reward is not None:
        if not reward.selected() and not rm_on:
            msg = (
                'no reward selected; set reward.default = "NAME", map [reward.sources] '
                "or enable [reward_model]"
            )
            problems.append((("reward", "default"), msg))
        if RM_SCORER in reward.selected() or RM_SCORER in reward.weights:
            msg = (
                f"{RM_SCORER!r} is the reward model's scorer: set [reward_model] enable and "
                "weight instead"
            )
            key = "weights" if RM_SCORER in reward.weights else "default"
            problems.append((("reward", key), msg))
        for name in reward.weights:
            if name not in reward.selected():
                msg = f"reward {name!r} is not selected by reward.default or reward.sources"
                problems.append((("reward", "weights", name), msg))
    return problems


# --- defaults that depend on other keys -------------------------------------------------------

# Tokens (prompt + response, padded) per micro-batch when neither micro-batch key is set: one
# micro-batch for the quickstart's 256 rows x ~60 tokens; on a GPU, a 7B model's activations
# with gradient checkpointing and its (tokens, vocab) logits fit in tens of GB.
DEFAULT_MAX_TOKENS_PER_MICRO_BATCH = 16384


def _micro_unset(cfg: Any) -> bool:
    return cfg.micro_batch_size is None and cfg.max_tokens_per_micro_batch is None


def _micro_or(cfg: Any, inherited: dict[str, Any]) -> dict[str, Any]:
    """A role's own micro-batching when it sets one, else the actor's."""
    return inherited if _micro_unset(cfg) else {}


def _resolved(
    s: dict[str, Any], reward_configs: dict[str, Any], logger_configs: dict[str, Any]
) -> RunConfig:
    data: DataConfig = s["data"]
    model: ModelConfig = s["model"]
    actor: ActorConfig = s["actor"]
    # The micro-batch rule's one default, for the actor; ref and critic inherit the actor's.
    # Dynamic micro-batches: as many rows as fit the budget, instead of one row per
    # forward/backward (issue 16); set micro_batch_size for fixed counts.
    micro: dict[str, Any] = (
        {"micro_batch_size": None, "max_tokens_per_micro_batch": DEFAULT_MAX_TOKENS_PER_MICRO_BATCH}
        if _micro_unset(actor)
        else {
            "micro_batch_size": actor.micro_batch_size,
            "max_tokens_per_micro_batch": actor.max_tokens_per_micro_batch,
        }
    )
    actor = attrs.evolve(
        actor, ppo_mini_batch_size=actor.ppo_mini_batch_size or data.train_batch_size, **micro
    )
    ref: RefConfig = s["ref"]
    ref = attrs.evolve(ref, engine=ref.engine or actor.engine, **_micro_or(ref, micro))
    critic: CriticConfig = s["critic"]
    critic = attrs.evolve(
        critic,
        model_path=critic.model_path or model.path,
        engine=critic.engine or actor.engine,
        ppo_mini_batch_size=critic.ppo_mini_batch_size or actor.ppo_mini_batch_size,
        ppo_epochs=critic.ppo_epochs or actor.ppo_epochs,
        **_micro_or(critic, micro),
    )
    rm: RewardModelConfig = s["reward_model"]
    rm = attrs.evolve(
        rm,
        model=attrs.evolve(rm.model, dtype=rm.model.dtype or model.dtype),
        engine=rm.engine or actor.engine,
        **_micro_or(rm, micro),
    )
    reward: RewardConfig = s["reward"]
    weights = {name: reward.weights.get(name, 1.0) for name in reward.selected()}
    reward = attrs.evolve(reward, weights=weights, options=reward_configs)
    trainer: TrainerConfig = s["trainer"]
    trainer = attrs.evolve(
        trainer,
        total_epochs=1
        if trainer.total_steps is None and not trainer.total_epochs
        else trainer.total_epochs,
        run_dir=trainer.run_dir or f"runs/{trainer.experiment_name}",
        logger_options=logger_configs,
    )
    return RunConfig(
        data=data,
        model=attrs.evolve(model, tokenizer_path=model.tokenizer_path or model.path),
        actor=actor,
        rollout=s["rollout"],
        ref=ref,
        critic=critic,
        reward=reward,
        algorithm=s["algorithm"],
        trainer=trainer,
        resources=s["resources"],
        plugins=s["plugins"],
        agent=s["agent"],
        roles={
            name: attrs.evolve(
                role,
                model=attrs.evolve(role.model, dtype=role.model.dtype or model.dtype),
                engine=role.engine or actor.engine,
                **_micro_or(role, micro),
            )
            for name, role in s[ROLES].items()
        },
        reward_model=rm,
    )


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
    problems.extend(_cross_checks(sections))

    lines.extend(f"{render_path(p)}: {m}" if p else m for p, m in problems)
    if lines:
        raise ConfigValidationError(source, lines)
    if sections["agent"] is not None:
        sections["agent"] = attrs.evolve(sections["agent"], options=tool_configs)
    return _resolved(sections, reward_configs, logger_configs)


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
    raw = _parse_toml(text, source)
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
