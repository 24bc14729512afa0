"""``key()``: declare one config key, an attrs field with its help text.

Every section of a run's TOML is an attrs class (the core's in :mod:`rlcore.config.schema`,
each plugin's ``Config``), and every key of it needs help text: the reference
(``docs/config.md``, ``rlcore config explain``) is read from the fields. ``key`` is
``attrs.field`` with the help text as its second argument, so a key reads as one line of
name, type, default, help and validator::

    @attrs.frozen(kw_only=True)
    class Config:
        max_turns: int = key(4, "Model turns per conversation.", validator=v.ge(1))
        path: str = key(help="Local Hugging Face folder.", validator=nonempty)  # required
        sources: dict[str, str] = key(factory=dict, help="data_source -> reward name.")
        tokenizer_path: str = key(None, "Folder of the tokenizer.", shown_default="model.path")

It writes the same attrs metadata a hand-written field would (``"help"``; ``"default"`` from
``shown_default``, the text shown for a default resolved from other keys; ``"allowed"`` for
a validator written as a function), so both styles mix freely. This module imports nothing
but attrs: the core's interfaces and every plugin may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

__all__ = ["key"]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], Any]


def key(
    default: Any = attrs.NOTHING,
    help: str = "",
    *,
    validator: Validator | Sequence[Validator] | None = None,
    factory: Callable[[], Any] | None = None,
    shown_default: str | None = None,
    allowed: str | None = None,
) -> Any:
    """An attrs field for a config key: ``default`` (none given: the key is required, or
    ``factory`` makes it), ``help`` (required: the key's effect in one or two sentences),
    ``validator`` (one or a list), ``shown_default`` and ``allowed`` (reference texts)."""
    if not help:
        msg = "key() needs help text: what the key does, for docs/config.md"
        raise TypeError(msg)
    metadata = {"help": help}
    if shown_default is not None:
        metadata["default"] = shown_default
    if allowed is not None:
        metadata["allowed"] = allowed
    return attrs.field(default=default, factory=factory, validator=validator, metadata=metadata)
