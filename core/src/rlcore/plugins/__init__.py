"""Plugin discovery: entry points of the ``rlcore`` group, loaded into a pluggy manager.

A :class:`PluginRegistry` imports every plugin *module* (they are a few lines and import
nothing heavy), calls each hook implementation on its own so every name can be traced to its
distribution and version, and imports a component's ``"module:Class"`` target only when
:meth:`PluginRegistry.resolve` asks for it. A plugin that fails to load is recorded with its
distribution and does not take the others down; ``strict=True`` raises instead.

``[plugins] disabled`` (distribution or entry-point names, or ``"*"``; the ``rlcore`` command
maps ``RLCORE_DISABLE_PLUGINS`` onto it) skips entry points before they are imported.

Every plugin module declares the contract it was written for (``contract_version = 2`` at
module level, :data:`rlcore.interfaces.CONTRACT_VERSION`). An installed plugin that declares
another version, or none, is *refused*: its hooks are called only to learn the names it would
provide, which then resolve to one line naming the distribution, its contract against the
current one, what changed and where the migration note is, so ``rlcore train`` stops at
config validation instead of failing inside a worker. In-process plugins (tests, notebooks)
are checked only when they declare a version.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Protocol

import attrs
import pluggy

from rlcore import hookspecs
from rlcore.errors import PluginError
from rlcore.interfaces import (
    CONTRACT_CHANGES,
    CONTRACT_NOTE,
    CONTRACT_VERSION,
    BaseAlgorithm,
    BaseBatchReward,
    BaseEngine,
    BaseEnvironment,
    BaseHarness,
    BaseLogger,
    BaseReward,
    BaseRollout,
    BaseTool,
)
from rlcore.interfaces.signatures import describe_mismatches, signature_mismatches
from rlcore.plugins.source import read_source, status_from_source

log = logging.getLogger(__name__)

__all__ = [
    "ACCEPTED_BASES",
    "BASES",
    "DISABLED_KEY",
    "ENTRY_POINT_GROUP",
    "FUNCTION_KINDS",
    "INSTALL_HINTS",
    "KINDS",
    "Component",
    "PluginEntry",
    "PluginProblem",
    "PluginRegistry",
    "active_registry",
    "contract_refusal",
    "current_registry",
    "default_registry",
    "set_disabled_plugins",
]

ENTRY_POINT_GROUP: Final = "rlcore"
DISABLED_KEY: Final = "[plugins] disabled"

KINDS: Final = (
    "engine",
    "rollout",
    "reward",
    "algorithm",
    "tool",
    "harness",
    "environment",
    "logger",
    "policy_loss",
    "adv_estimator",
)
# Kinds whose targets are functions ("module:function"), resolved by resolve_function; the
# others are classes with a Config, resolved by resolve.
FUNCTION_KINDS: Final = ("policy_loss", "adv_estimator")
_HOOKS: Final = {
    "engine": "register_engines",
    "rollout": "register_rollouts",
    "reward": "register_rewards",
    "algorithm": "register_algorithms",
    "tool": "register_tools",
    "harness": "register_harnesses",
    "environment": "register_environments",
    "logger": "register_loggers",
    "policy_loss": "register_policy_losses",
    "adv_estimator": "register_adv_estimators",
}
# The interface class of each kind (the conformance checks read it too).
BASES: Final[dict[str, type]] = {
    "engine": BaseEngine,
    "rollout": BaseRollout,
    "reward": BaseReward,
    "algorithm": BaseAlgorithm,
    "tool": BaseTool,
    "harness": BaseHarness,
    "environment": BaseEnvironment,
    "logger": BaseLogger,
}
# Every interface a kind's class may subclass: a reward is per-sample (BaseReward) or batched
# (BaseBatchReward), one kind and one name space, so [reward] mixes them by name.
ACCEPTED_BASES: Final[dict[str, tuple[type, ...]]] = {
    kind: (base, BaseBatchReward) if kind == "reward" else (base,) for kind, base in BASES.items()
}

# Where the first-party components live, for "not installed" messages only: the core never
# branches on a plugin name for behaviour. Each is the distribution ``rlcore-<name>``.
INSTALL_HINTS: Final[dict[tuple[str, str], str]] = {
    (kind, name): f"rlcore-{name}"
    for kind, names in {
        "engine": ("fsdp2", "megatron"),
        "rollout": ("hf", "vllm", "sglang"),
        "reward": ("gsm8k", "math", "code"),
        "algorithm": ("ppo", "grpo", "rloo", "dapo", "remax", "distill"),
        "tool": ("calculator",),

        "logger": ("wandb", "mlflow"),
    }.items()
    for name in names
}


def _normalize(name: str) -> str:
    """PEP 503 normalisation, so ``rlcore_fsdp2`` and ``rlcore-fsdp2`` match."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _describe(err: BaseException) -> str:
    if isinstance(err, ImportError):
        return str(err)
    return f"{type(err).__name__}: {err}"


@attrs.frozen(kw_only=True)
class PluginEntry:
    """One registered name: ``kind`` + ``name`` -> ``target`` ("module:Class" or a class)."""

    kind: str
    name: str
    target: str | type | Callable[..., Any]  # a function for the function kinds
    distribution: str | None  # None for a plugin registered in-process (tests)
    version: str | None
    plugin: str  # the entry point (or registration) name

    @property
    def target_name(self) -> str:
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{self.target.__qualname__}"

    @property
    def provider(self) -> str:
        if self.distribution is None:
            return f"plugin {self.plugin!r}"
        return f"{self.distribution} {self.version}"


@attrs.frozen(kw_only=True)
class PluginProblem:
    """A plugin module that was disabled, failed to load, or registered something wrong."""

    distribution: str | None
    version: str | None
    plugin: str
    status: str  # "disabled", "duplicate", "refused" or "error"
    reason: str  # short, for a table that already shows the distribution
    message: str  # one line, naming the distribution


@attrs.frozen
class _Provenance:
    distribution: str | None
    version: str | None
    plugin: str

    @property
    def label(self) -> str:
        if self.distribution is None:
            return "in-process plugin"
        return f"{self.distribution} {self.version}"

    def entry(self, kind: str, name: str, target: str | type | Callable[..., Any]) -> PluginEntry:
        """``name`` -> ``target`` as registered by this plugin."""
        return PluginEntry(
            kind=kind,
            name=name,
            target=target,
            distribution=self.distribution,
            version=self.version,
            plugin=self.plugin,
        )


def contract_refusal(declared: object) -> str | None:
    """Why a plugin declaring ``contract_version = declared`` is refused; None: it is current.

    ``declared`` is None for a module that declares nothing: it was written before contracts
    were versioned, for contract 1. One clause, naming both versions, what changed since and
    :data:`~rlcore.interfaces.CONTRACT_NOTE`.
    """
    current = CONTRACT_VERSION
    if declared is None:
        version, said = 1, " (it declares no contract_version)"
    elif isinstance(declared, int) and not isinstance(declared, bool):
        version, said = declared, ""
    else:
        return (
            f"its contract_version must be an int, got {declared!r}; this rlcore implements "
            f"contract {current} ({CONTRACT_NOTE})"
        )
    if version == current:
        return None
    if version > current:
        return (
            f"written for plugin contract {version}, newer than this rlcore's contract "
            f"{current}: upgrade rlcore ({CONTRACT_NOTE})"
        )
    changes = "; ".join(
        f"contract {v}: {CONTRACT_CHANGES[v]}" for v in range(version + 1, current + 1)
    )
    return (
        f"written for plugin contract {version}{said}, this rlcore implements contract "
        f"{current} ({changes}); {CONTRACT_NOTE}"
    )


class PluginRegistry:
    """The components that installed plugins provide, by kind and name.

    Build a fresh one per test (``PluginRegistry(entry_points=False)`` plus :meth:`register`
    for in-process plugins); production code uses :func:`default_registry`.
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        entry_points: bool = True,
        builtins: bool = True,
        disabled: Iterable[str] | None = None,
    ) -> None:
        self.strict = strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.problems: list[PluginProblem] = []
        self._entries: dict[str, dict[str, list[PluginEntry]]] = {k: {} for k in KINDS}
        # What refused plugins would provide, with the line each name resolves to.
        self._refused: dict[str, dict[str, tuple[PluginEntry, str]]] = {k: {} for k in KINDS}
        # Refused plugins are registered here, never in ``pm``: only to call their hooks.
        self._refused_pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._refused_pm.add_hookspecs(hookspecs)
        self._provenance: dict[int, _Provenance] = {}
        self._resolved: dict[tuple[str, str], type] = {}
        self._resolved_functions: dict[tuple[str, str], Callable[..., Any]] = {}
        if disabled is None:
            disabled = _process_disabled
        self._disabled = {_normalize(d.strip()) for d in disabled if d.strip()}
        # The core's own components (the console, jsonl and tensorboard loggers, the policy
        # losses and advantage estimators) register through the same hooks; a registry without
        # entry points still has them unless ``builtins`` is off (checking one plugin module
        # alone).
        if builtins:
            from rlcore import builtin

            self._register(builtin, _Provenance("rlcore", _core_version(), "builtin"))
        if entry_points:
            self._load_entry_points()

    # --- loading ---------------------------------------------------------------------------

    def _is_disabled(self, dist_name: str, ep_name: str) -> bool:
        d = self._disabled
        return "*" in d or _normalize(dist_name) in d or _normalize(ep_name) in d

    def _problem(self, prov: _Provenance, status: str, reason: str, message: str) -> None:
        if self.strict and status != "disabled":
            raise PluginError(message)
        # A refused plugin is reported where it matters: when a config selects one of its
        # names (and in ``rlcore plugins``); a warning on every listing would be noise.
        quiet = status in ("disabled", "refused")
        log.log(logging.DEBUG if quiet else logging.WARNING, "%s", message)
        self.problems.append(
            PluginProblem(
                distribution=prov.distribution,
                version=prov.version,
                plugin=prov.plugin,
                status=status,
                reason=reason,
                message=message,
            )
        )

    def _load_entry_points(self) -> None:
        seen: set[tuple[str, str]] = set()
        dists = sorted(
            importlib.metadata.distributions(), key=lambda d: _normalize(d.metadata["Name"] or "")
        )
        for dist in dists:
            dist_name = dist.metadata["Name"] or "?"
            eps = sorted(
                (ep for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP),
                key=lambda ep: ep.name,
            )
            for ep in eps:
                # The same distribution can sit twice on sys.path (editable install + a
                # checkout); the first one wins, as it does for imports.
                key = (_normalize(dist_name), ep.name)
                if key in seen:
                    continue
                seen.add(key)
                prov = _Provenance(dist_name, dist.version, ep.name)
                if self._is_disabled(dist_name, ep.name):
                    msg = (
                        f"{dist_name} {dist.version}: plugin {ep.name!r} disabled by {DISABLED_KEY}"
                    )
                    self._problem(prov, "disabled", f"disabled by {DISABLED_KEY}", msg)
                    continue
                try:
                    module = ep.load()
                except Exception as err:  # any error in third-party import code; recorded
                    msg = (
                        f"plugin {ep.name!r} ({ep.value}) of {dist_name} {dist.version} "
                        f"could not be loaded: {_describe(err)}"
                    )
                    if self.strict:
                        raise PluginError(msg) from err
                    self._problem(prov, "error", f"import error: {_describe(err)}", msg)
                    continue
                self._register(module, prov, versioned=True)

    def register(self, plugin: object, *, name: str | None = None) -> None:
        """Register an in-process plugin (a module or object with ``@hookimpl`` functions).

        Its ``contract_version`` is checked only when it declares one.
        """
        label = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        self._register(plugin, _Provenance(None, None, label), versioned=False)

    def _register(self, plugin: object, prov: _Provenance, *, versioned: bool = True) -> None:
        where = prov.label
        # Discovery reads the module's declaration (not a capability probe: the contract says
        # every plugin module has this attribute).
        declared = getattr(plugin, "contract_version", None)
        refusal = contract_refusal(declared) if versioned or declared is not None else None
        if refusal is not None:
            self._refuse(plugin, prov, refusal)
            return
        try:
            # Entry-point names are unique only within a distribution.
            self.pm.register(plugin, name=f"{prov.distribution}:{prov.plugin}")
        except (ValueError, pluggy.PluginValidationError) as err:
            msg = f"{where}: plugin {prov.plugin!r} is invalid: {err}"
            self._problem(prov, "error", f"invalid plugin: {err}", msg)
            return
        self._provenance[id(plugin)] = prov
        for caller in self.pm.get_hookcallers(plugin) or []:
            if caller.has_spec():
                continue
            # A misspelled hook (register_engine) would otherwise be silently never called.
            hint = difflib.get_close_matches(caller.name, list(_HOOKS.values()), n=1)
            reason = f"unknown hook {caller.name!r}"
            if hint:
                reason += f" (did you mean {hint[0]!r}?)"
            msg = f"{where}: plugin {prov.plugin!r} implements {reason}"
            self._problem(prov, "error", reason, msg)
        for kind, hook_name in _HOOKS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    self._collect(kind, impl.function, prov)

    def _refuse(self, plugin: object, prov: _Provenance, refusal: str) -> None:
        """Record a plugin written for another contract, and the names it would provide."""
        message = f"{prov.label}: plugin {prov.plugin!r} is refused: {refusal}"
        self._problem(prov, "refused", f"refused: {refusal}", message)
        try:
            self._refused_pm.register(plugin, name=f"{prov.distribution}:{prov.plugin}")
        except (ValueError, pluggy.PluginValidationError):
            return  # no names to learn; the refusal is recorded
        for kind, hook_name in _HOOKS.items():
            for impl in getattr(self._refused_pm.hook, hook_name).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    result = impl.function()
                except Exception:  # third-party hook code; the refusal says enough
                    continue
                if not isinstance(result, Mapping):
                    continue
                for name, target in result.items():
                    if isinstance(name, str) and isinstance(target, str | type):
                        entry = prov.entry(kind, name, target)
                        self._refused[kind].setdefault(name, (entry, refusal))

    def refused_entries(self) -> list[tuple[PluginEntry, str]]:
        """What refused plugins would provide (names no accepted plugin has), with the reason
        of each refusal; sorted by kind then name."""
        return [
            self._refused[k][n]
            for k in KINDS
            for n in sorted(self._refused[k])
            if n not in self._entries[k]
        ]

    def _refused_message(self, kind: str, name: str, where: str | None) -> str:
        entry, refusal = self._refused[kind][name]
        at = f" in {where}" if where else ""
        whose = f", whose plugin {entry.plugin!r}" if entry.distribution else ", which"
        return (
            f"{kind} {name!r}{at} is provided only by {entry.provider}{whose} is refused: {refusal}"
        )

    def _collect(self, kind: str, function: Any, prov: _Provenance) -> None:
        where = prov.label
        hook_name = _HOOKS[kind]
        try:
            result = function()
        except Exception as err:  # third-party hook code; recorded with its distribution
            reason = f"{hook_name}() failed: {_describe(err)}"
            msg = f"{where}: {hook_name}() of plugin {prov.plugin!r} failed: {_describe(err)}"
            if self.strict:
                raise PluginError(msg) from err
            self._problem(prov, "error", reason, msg)
            return
        if not isinstance(result, Mapping):
            msg = (
                f"{where}: {hook_name}() of plugin {prov.plugin!r} must return a mapping "
                f"name -> 'module:Class', got {type(result).__name__}"
            )
            self._problem(prov, "error", f"{hook_name}() returned no mapping", msg)
            return
        # Function kinds (policy losses, estimators) register "module:function" or a function.
        what = "function" if kind in FUNCTION_KINDS else "Class"
        for name, target in result.items():
            in_process = (
                callable(target) and not isinstance(target, type)
                if kind in FUNCTION_KINDS
                else isinstance(target, type)
            )
            bad_target = not in_process and not (isinstance(target, str) and ":" in target)
            if not isinstance(name, str) or bad_target:
                msg = (
                    f"{where}: {hook_name}() of plugin {prov.plugin!r} registered "
                    f"{name!r} -> {target!r}; expected a name -> 'module:{what}' string or "
                    f"{what.lower()}"
                )
                self._problem(prov, "error", f"bad registration {name!r} -> {target!r}", msg)
                continue
            existing = self._entries[kind].setdefault(name, [])
            existing.append(prov.entry(kind, name, target))
            if len(existing) > 1:
                msg = self._duplicate_message(kind, name)
                self._problem(prov, "duplicate", msg, msg)

    def _duplicate_message(self, kind: str, name: str) -> str:
        providers = [e.provider for e in self._entries[kind][name]]
        return f"{kind} {name!r} is provided by both {' and '.join(providers)}"

    # --- queries ---------------------------------------------------------------------------

    def entries(self, kind: str | None = None) -> list[PluginEntry]:
        """Every registered name (duplicates included), sorted by kind then name."""
        kinds = KINDS if kind is None else (self._check_kind(kind),)
        return [e for k in kinds for n in sorted(self._entries[k]) for e in self._entries[k][n]]

    def names(self, kind: str) -> list[str]:
        """The names of ``kind`` that resolve to one provider (duplicates excluded)."""
        found = self._entries[self._check_kind(kind)]
        return sorted(n for n, es in found.items() if len(es) == 1)

    def is_duplicate(self, kind: str, name: str) -> bool:
        return len(self._entries[self._check_kind(kind)].get(name, ())) > 1

    def entry(self, kind: str, name: str) -> PluginEntry | None:
        """The one entry of ``name`` (None when it is unknown or a duplicate)."""
        found = self._entries[self._check_kind(kind)].get(name, [])
        return found[0] if len(found) == 1 else None

    def _check_kind(self, kind: str) -> str:
        if kind not in KINDS:
            msg = f"unknown plugin kind {kind!r}; expected one of {', '.join(KINDS)}"
            raise PluginError(msg)
        return kind

    def resolve(self, kind: str, name: str, *, where: str | None = None) -> type:
        """Import and return the class registered as ``name`` of ``kind``.

        ``where`` names the config section that selected it, for the error message
        (``"[actor.engine] of run.toml"``).
        """
        self._check_kind(kind)
        if kind in FUNCTION_KINDS:
            msg = f"{kind} names a function: use resolve_function({kind!r}, {name!r})"
            raise PluginError(msg)
        cls: type = self._resolve_cached(self._resolved, kind, name, where, self._class_problem)
        return cls

    def resolve_function(self, kind: str, name: str, *, where: str | None = None) -> Any:
        """Import and return the function registered as ``name`` of a function kind
        (``policy_loss``, ``adv_estimator``); :mod:`rlcore.rl.registry` is the typed front.

        ``where`` names the config key that selected it (``"[algorithm] policy_loss"``).
        """
        if self._check_kind(kind) not in FUNCTION_KINDS:
            msg = f"{kind} names a class: use resolve({kind!r}, {name!r})"
            raise PluginError(msg)
        return self._resolve_cached(
            self._resolved_functions, kind, name, where, self._function_problem
        )

    def _resolve_cached(
        self,
        cache: dict[tuple[str, str], Any],
        kind: str,
        name: str,
        where: str | None,
        problem: Callable[[str, object], str | None],
    ) -> Any:
        """What ``name`` of ``kind`` names, imported once and kept in ``cache``; refused with
        the entry and its provider when ``problem(kind, target)`` says what is wrong with it."""
        cached = cache.get((kind, name))
        if cached is not None:
            return cached
        entry, target = self._import_one(kind, name, where)
        why = problem(kind, target)
        if why is not None:
            msg = f"{kind} {name!r} ({entry.target_name}) from {entry.provider}{why}"
            raise PluginError(msg)
        cache[(kind, name)] = target
        return target

    @staticmethod
    def _class_problem(kind: str, cls: object) -> str | None:
        bases = ACCEPTED_BASES[kind]
        if not (isinstance(cls, type) and issubclass(cls, bases)):
            # The contracts' public names (rlcore.interfaces.BaseReward), not the modules they
            # are written in.
            wanted = " or ".join(f"rlcore.interfaces.{b.__name__}" for b in bases)
            return f" is not a subclass of {wanted}"
        config_cls = cls.Config  # type: ignore[attr-defined]
        # A plain subclass of an attrs class passes attrs.has() but drops its own fields.
        if not attrs.has(config_cls) or "__attrs_attrs__" not in vars(config_cls):
            return ": its Config must be an attrs class (@attrs.frozen(kw_only=True))"
        # Found here, before Ray, rather than as a TypeError inside a worker.
        mismatches = signature_mismatches(cls, bases)
        if mismatches:
            return f": {describe_mismatches(mismatches)}"
        return None

    @staticmethod
    def _function_problem(kind: str, fn: object) -> str | None:
        # A class is callable too, but the registries promise plain functions of one signature.
        if isinstance(fn, type) or not callable(fn):
            return f" is not a function, got {type(fn).__name__}"
        return None

    def _import_one(self, kind: str, name: str, where: str | None) -> tuple[PluginEntry, object]:
        """The one entry registered as ``name`` and what it names, imported; otherwise the
        error that says why not (refused, unknown or not installed, or provided twice)."""
        found = self._entries[kind].get(name)
        if not found and name in self._refused[kind]:
            also = self.refused_also(self._refused[kind][name][0])
            raise PluginError(self._refused_message(kind, name, where) + also)
        if not found:
            raise PluginError(self._unknown_message(kind, name, where))
        if len(found) > 1:
            raise PluginError(self._duplicate_message(kind, name))
        return found[0], self._import(found[0])

    def refused_also(self, entry: PluginEntry) -> str:
        """What else a refused plugin's class must change, so that one migration fixes it
        all: ``"; also its methods ..."`` read from its source (a refused plugin's code is
        never run), or ``""``."""
        status = self.check(entry)
        if not status.startswith("refused: "):
            return ""
        # The refusal already ends with where the note is.
        return f"; also {status.removeprefix('refused: ').removesuffix(f' ({CONTRACT_NOTE})')}"

    def _import(self, entry: PluginEntry) -> object:
        if not isinstance(entry.target, str):
            return entry.target
        module_name, _, attr_path = entry.target.partition(":")
        try:
            obj: object = importlib.import_module(module_name)
        except Exception as err:  # any import-time failure of plugin code becomes one line
            msg = (
                f"{entry.kind} {entry.name!r} ({entry.target}) could not be imported: "
                f"{_describe(err)}"
            )
            if isinstance(err, ImportError):
                msg += _install_hint(entry, module_name, err)
            raise PluginError(msg) from err
        for part in attr_path.split("."):
            if not hasattr(obj, part):
                msg = (
                    f"{entry.kind} {entry.name!r} ({entry.target}) from {entry.provider}: "
                    f"module {module_name!r} has no attribute {attr_path!r}"
                )
                raise PluginError(msg)
            obj = getattr(obj, part)
        return obj

    def check(self, entry: PluginEntry) -> str:
        """``ok``, ``import error: ...`` or ``class missing: ...`` for one registered target.

        Without importing the target where it can: the module is found with
        ``importlib.util.find_spec``, its source is parsed for the class and for top-level
        imports of packages that are not installed (a missing backend such as ``vllm``).
        Only a module without readable source is imported.
        """
        if not isinstance(entry.target, str):
            return "ok"
        module_name, _, attr_path = entry.target.partition(":")
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError) as err:
            return f"import error: {_describe(err)}"
        if spec is None:
            return f"import error: No module named {module_name!r}"
        source = read_source(spec.origin)
        if source is None:
            try:
                self._import(entry)
            except PluginError as err:
                text = str(err)
                return "class missing" if "has no attribute" in text else f"import error: {text}"
            return "ok"
        bases = None if entry.kind in FUNCTION_KINDS else ACCEPTED_BASES[entry.kind]
        return status_from_source(source, module_name, attr_path, bases)

    def _unknown_message(self, kind: str, name: str, where: str | None) -> str:
        at = f" in {where}" if where else ""
        hint = INSTALL_HINTS.get((kind, name))
        if hint is not None:
            for p in self.problems:
                if p.distribution and _normalize(p.distribution) == hint:
                    return f"{kind} {name!r}{at} is not available: {p.message}"
            return f"{kind} {name!r}{at} is not installed. Install it with: pip install {hint}"
        installed = self.names(kind)
        msg = f"unknown {kind} {name!r}{at}. Installed: {', '.join(installed) or 'none'}."
        known = {n for k, n in INSTALL_HINTS if k == kind}
        close = difflib.get_close_matches(name, sorted(set(installed) | known), n=1)
        if close:
            suggestion = close[0]
            msg += f" Did you mean {suggestion!r}?"
            if suggestion not in installed:
                msg += f" (pip install {INSTALL_HINTS[(kind, suggestion)]})"
        return msg


def _install_hint(entry: PluginEntry, module_name: str, err: ImportError) -> str:
    """Name what to install: the plugin itself only when its own module is what is missing."""
    missing = getattr(err, "name", None)
    own = module_name.split(".")[0]
    if missing and missing.split(".")[0] != own:
        by = f"{entry.distribution} is installed but needs" if entry.distribution else "needs"
        return f". {by} {missing!r}: install the package that provides it"
    if entry.distribution:
        return f". Install it with: pip install {entry.distribution}"
    return ""


def _core_version() -> str:
    try:
        return importlib.metadata.version("rlcore")
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path
        return "0+unknown"


# This process's ``[plugins] disabled``: set by the run (driver and every worker, from the
# config and the worker's spec) before anything is resolved.
_process_disabled: tuple[str, ...] = ()


def set_disabled_plugins(names: Iterable[str]) -> None:
    """Make ``names`` this process's ``[plugins] disabled`` (for registries built from now)."""
    global _process_disabled
    _process_disabled = tuple(names)


def default_registry(disabled: Iterable[str] | None = None) -> PluginRegistry:
    """The process-wide registry of installed plugins, loaded on first use (one per
    ``disabled`` list; None: this process's, see :func:`set_disabled_plugins`)."""
    return _registry(tuple(_process_disabled if disabled is None else disabled))


@functools.cache
def _registry(disabled: tuple[str, ...]) -> PluginRegistry:
    return PluginRegistry(disabled=disabled)


# The registry a config being loaded resolves names with: load_config's own (a test's, or the
# one [plugins] disabled chose), so validators inside plugin Configs agree with the loader.
_ACTIVE: contextvars.ContextVar[PluginRegistry | None] = contextvars.ContextVar(
    "rlcore_active_registry", default=None
)


@contextlib.contextmanager
def active_registry(registry: PluginRegistry) -> Iterator[PluginRegistry]:
    """Within the block, :func:`current_registry` is ``registry``."""
    token = _ACTIVE.set(registry)
    try:
        yield registry
    finally:
        _ACTIVE.reset(token)


def current_registry() -> PluginRegistry:
    """The registry of the config being loaded (:func:`active_registry`), else the process's."""
    active = _ACTIVE.get()
    return active if active is not None else default_registry()


# --- the one component builder ------------------------------------------------------------
# The one component builder: a plugin's name + its ``Config`` -> an instance.
#
# The driver and the workers build every engine, rollout, algorithm and reward through
# :meth:`Component.build`, so plugin lookup, the error for an unknown or broken plugin and the
# construction call exist once. A :class:`Component` is a small frozen value (it pickles to Ray
# workers); the registry lookup happens where the instance is needed, so a worker imports only
# the backends its own roles use::
#
#     engine = Component.of("engine", config.actor.engine, where="[actor.engine]")
#     actor = engine.build(spec)            # FSDP2Engine(spec, FSDP2Engine.Config(...))


class _Section(Protocol):
    """A config section that selects a plugin (``rlcore.config.PluginSection``): a protocol
    here, so the registry does not import the config that validates through it."""

    @property
    def name(self) -> str: ...
    @property
    def options(self) -> Any: ...


@attrs.frozen(kw_only=True)
class Component:
    """A selected plugin: ``kind`` ("engine", "rollout", "algorithm", "reward"), ``name``,
    its ``Config`` instance (``options``, None: the plugin's defaults) and ``where`` it was
    configured (a config section, for error messages)."""

    kind: str
    name: str
    options: Any = None
    where: str = ""
    # The class itself, for a component of an in-process plugin (see :meth:`pinned`): a
    # worker process has no entry point to find it by name.
    target: type | None = None

    @classmethod
    def of(cls, kind: str, section: _Section, *, where: str) -> Component:
        """From a config section holding ``name`` and ``options``."""
        return cls(kind=kind, name=section.name, options=section.options, where=where)

    def pinned(self, registry: PluginRegistry | None) -> Component:
        """This component, carrying its class when ``registry`` has it from an in-process
        plugin (:meth:`PluginRegistry.register`), so that workers build what the driver
        resolved; installed plugins stay by name (each process finds them itself)."""
        if registry is None or self.target is not None:
            return self
        entry = registry.entry(self.kind, self.name)
        if entry is None or entry.distribution is not None:
            return self
        return attrs.evolve(self, target=self.resolve(registry))

    def resolve(self, registry: PluginRegistry | None = None) -> type:
        """The plugin class (imports its module); a :class:`PluginError` names the fix."""
        if self.target is not None:
            return self.target
        registry = registry if registry is not None else default_registry()
        return registry.resolve(self.kind, self.name, where=self.where or None)

    def build(self, *args: Any, registry: PluginRegistry | None = None) -> Any:
        """``cls(*args, options)``: what every base class's ``__init__`` takes."""
        return self.resolve(registry)(*args, self.options)
