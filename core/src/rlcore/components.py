"""The one component builder: a plugin's name + its ``Config`` -> an instance.

The driver and the workers build every engine, rollout, algorithm and reward through
:meth:`Component.build`, so plugin lookup, the error for an unknown or broken plugin and the
construction call exist once. A :class:`Component` is a small frozen value (it pickles to Ray
workers); the registry lookup happens where the instance is needed, so a worker imports only
the backends its own roles use::

    engine = Component.of("engine", config.actor.engine, where="[actor.engine]")
    actor = engine.build(spec)            # FSDP2Engine(spec, FSDP2Engine.Config(...))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from rlcore.config import PluginSection
    from rlcore.plugins import PluginRegistry

__all__ = ["Component"]


@attrs.frozen(kw_only=True)
class Component:
    """A selected plugin: ``kind`` ("engine", "rollout", "algorithm", "reward"), ``name``,
    its ``Config`` instance (``options``, None: the plugin's defaults) and ``where`` it was
    configured (a config section, for error messages)."""

    kind: str
    name: str
    options: Any = None
    where: str = ""

    @classmethod
    def of(cls, kind: str, section: PluginSection, *, where: str) -> Component:
        """From a config section holding ``name`` and ``options``."""
        return cls(kind=kind, name=section.name, options=section.options, where=where)

    def resolve(self, registry: PluginRegistry | None = None) -> type:
        """The plugin class (imports its module); a :class:`PluginError` names the fix."""
        from rlcore.plugins import default_registry

        registry = registry if registry is not None else default_registry()
        return registry.resolve(self.kind, self.name, where=self.where or None)

    def build(self, *args: Any, registry: PluginRegistry | None = None) -> Any:
        """``cls(*args, options)``: what every base class's ``__init__`` takes."""
        return self.resolve(registry)(*args, self.options)
