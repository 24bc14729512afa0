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

from rlcore.plugins.component import Component
from rlcore.plugins.entries import PluginEntry, PluginProblem, contract_refusal
from rlcore.plugins.kinds import (
    ACCEPTED_BASES,
    BASES,
    DISABLED_KEY,
    ENTRY_POINT_GROUP,
    FUNCTION_KINDS,
    INSTALL_HINTS,
    KINDS,
)
from rlcore.plugins.registry import (
    PluginRegistry,
    active_registry,
    current_registry,
    default_registry,
    set_disabled_plugins,
)

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
