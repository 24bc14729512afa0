"""What a registry records: one registered name (:class:`PluginEntry`), a plugin that could not
be used (:class:`PluginProblem`), where a registration came from, and the plugin-contract rule
(:func:`contract_refusal`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import attrs

from rlcore.interfaces import (
    CONTRACT_CHANGES,
    CONTRACT_NOTE,
    CONTRACT_VERSION,
)

log = logging.getLogger(__name__)


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
