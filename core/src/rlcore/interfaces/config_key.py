"""``key``: one config key of a plugin's (or the core's) ``Config``, with its help text;
``seconds``: the one check of every time-valued key."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

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


# What the code that waits can hold, in seconds. A time-valued key's maximum is the smallest
# of its consumers': past it the wait raises OverflowError (or overflows a C++ clock) in the
# middle of a run, where the key's name is long lost.
POLL_MAX_S: Final = (2**31 - 1) / 1000  # poll()/epoll_wait(): a C int of ms (24.8 days)
WAIT_MAX_S: Final = float(threading.TIMEOUT_MAX)  # Event/Condition/join/futures (292 years)


def check_seconds(
    name: str, value: Any, max_s: float = WAIT_MAX_S, holder: str = "a thread's wait"
) -> float:
    """``value`` as seconds, or ``ValueError`` in one line naming ``name``: a finite number
    > 0 and at most ``max_s`` (what ``holder``, the code that waits on it, can hold)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and 0 < value <= max_s):
        shown = value if ok else repr(value)
        msg = f"{name} must be a finite number > 0 and <= {int(max_s)} s ({holder}), got {shown}"
        raise ValueError(msg)
    return float(value)


@attrs.frozen
class Seconds:
    """The validator :func:`seconds` returns; ``allowed`` is its text in docs/config.md."""

    max_s: float
    holder: str

    @property
    def allowed(self) -> str:
        return f"> 0, <= {int(self.max_s)} s ({self.holder})"

    def check(self, name: str, value: Any) -> float:
        """``value`` as seconds, or ``ValueError`` naming ``name`` (for a constructor's
        argument that a config key also sets)."""
        return check_seconds(name, value, self.max_s, self.holder)

    def __call__(self, _inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        try:
            self.check(attr.name, value)
        except ValueError as err:
            # The loader prefixes the key's path: resources.call_timeout_s: must be ...
            raise ValueError(str(err).removeprefix(f"{attr.name} ")) from None


def seconds(max_s: float = WAIT_MAX_S, holder: str = "a thread's wait") -> Seconds:
    """The validator of a time-valued key: finite, > 0 and at most ``max_s``, the most the
    code that waits on it can hold (``holder`` says which, for the error and the docs)::

        timeout_s: float = key(5.0, "Time limit of one call (s).", validator=seconds())
        poll_s: float = key(1.0, "...", validator=seconds(POLL_MAX_S, "poll(), a C int of ms"))
        limit_s: float | None = key(None, "...", validator=attrs.validators.optional(seconds()))
    """
    return Seconds(float(max_s), holder)
