"""The one component builder: a plugin's name + its ``Config`` -> an instance."""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from rlcore.plugins.registry import PluginRegistry, default_registry

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
