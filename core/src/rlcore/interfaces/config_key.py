"""``key``: one config key of a plugin's (or the core's) ``Config``, with its help text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], Any]


def key(
    default: Any = attrs.NOTHING,
    help: str = "",
    *,
    validator: _Validator | Sequence[_Validator] | None = None,
    factory: Callable[[], Any] | None = None,
    shown_default: str | None = None,
    allowed: str | None = None,
) -> Any:
    """One config key: ``attrs.field`` with its help text as the second argument.

    Every section of a run's TOML is an attrs class (the core's in
    :mod:`rlcore.config.schema`, each plugin's ``Config``) and every key needs help text:
    the reference (``docs/config.md``, ``rlcore config explain``) is read from the fields::

        max_turns: int = key(4, "Model turns per conversation.", validator=v.ge(1))
        path: str = key(help="Local Hugging Face folder.", validator=nonempty)  # required
        sources: dict[str, str] = key(factory=dict, help="data_source -> reward name.")
        tokenizer_path: str = key(RESOLVED, "Folder of the tokenizer.", shown_default="model.path")

    ``default`` (none: the key is required, unless ``factory`` makes it), ``help``
    (required), ``validator`` (one or a list). The metadata is what a hand-written field
    carries: ``"help"``, ``"default"`` from ``shown_default`` (the text shown for a default
    resolved from other keys) and ``"allowed"`` (the text shown for a validator written as a
    function), so both styles mix.
    """
    if not help:
        msg = "key() needs help text: what the key does, for docs/config.md"
        raise TypeError(msg)
    metadata = {"help": help}
    if shown_default is not None:
        metadata["default"] = shown_default
    if allowed is not None:
        metadata["allowed"] = allowed
    return attrs.field(default=default, factory=factory, validator=validator, metadata=metadata)
