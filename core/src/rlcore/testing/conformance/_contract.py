"""``check_contract`` and ``check_signatures``: a plugin is written for the current contract.
``check_class`` and ``construct``: the start every ``check_*`` of a plugin class shares.

The contract's version is declared per plugin module (``contract_version``, checked by
discovery too); the signatures are checked per class: every abstract method of the
``rlcore.interfaces`` base that the class implements must take the base's keyword-only
parameters (the core calls them by keyword: ``forward_backward(..., temperature=T)``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from rlcore.interfaces import CONTRACT_VERSION
from rlcore.interfaces.signatures import describe_mismatches, signature_mismatches
from rlcore.plugins import ACCEPTED_BASES, contract_refusal
from rlcore.testing.conformance._common import check_config, check_subclass, fail, name_of

__all__ = ["check_class", "check_contract", "check_signatures", "construct"]


def check_contract(module: str | ModuleType) -> int:
    """The plugin module (or its import name) declares ``contract_version`` equal to
    :data:`rlcore.interfaces.CONTRACT_VERSION`; returns it."""
    mod = importlib.import_module(module) if isinstance(module, str) else module
    check_declared_version(f"plugin module {mod.__name__!r}", vars(mod).get("contract_version"))
    return CONTRACT_VERSION


def check_declared_version(what: str, declared: object) -> None:
    """``declared`` (a module's ``contract_version``, None when absent) is the current one."""
    refusal = contract_refusal(declared)
    if refusal is not None:
        fail(what, f"must declare contract_version = {CONTRACT_VERSION} at module level", refusal)


def check_signatures(cls: type) -> None:
    """Each abstract method of ``cls``'s ``rlcore.interfaces`` base that ``cls`` implements
    takes the keyword-only parameters the base declares, and no extra one without a default.

    A missing one (an engine written for contract 1 has no ``temperature``) fails where the
    core calls it; an extra one without a default cannot be given. ``**kwargs`` stands for
    any missing name. The same check refuses the class before Ray when a config selects it
    (:mod:`rlcore.interfaces.signatures`).
    """
    bases = [b for accepted in ACCEPTED_BASES.values() for b in accepted]
    if not any(isinstance(cls, type) and issubclass(cls, b) for b in bases):
        fail(repr(cls), "must subclass one of rlcore.interfaces' Base classes", f"got {cls!r}")
    mismatches = signature_mismatches(cls, bases)
    if mismatches:
        fail(
            name_of(cls), "methods take the contract's parameters", describe_mismatches(mismatches)
        )


def check_class(cls: type, base: type, config: Any, section: str) -> tuple[str, Any]:
    """What every ``check_*`` of a plugin class starts with: ``cls`` subclasses ``base``, its
    signatures and its ``Config`` follow the rules; returns its name for messages and
    ``config`` (its defaults when None)."""
    check_subclass(cls, base)
    check_signatures(cls)
    return name_of(cls), check_config(cls, config, section)


def construct(what: str, cls: type, config: Any, noun: str) -> Any:
    """``cls(config)``, any exception of the plugin's constructor a finding."""
    try:
        return cls(config)
    except Exception as err:  # the constructor is plugin code
        fail(what, f"cls(config) must build the {noun}", f"{type(err).__name__}: {err}")
