"""What every conformance check shares: the failure message and the ``Config`` rules."""

from __future__ import annotations

import math
import pickle
import time
from typing import Any, NoReturn

import attrs

from rlcore.config.convert import render_path, structure

__all__ = ["check_config", "check_subclass", "fail", "is_number"]

# A key no plugin's Config has: structuring it must be refused (forbid_extra_keys).
UNKNOWN_KEY = "conformance_unknown_key"


def fail(what: str, rule: str, detail: str) -> NoReturn:
    """Raise the one-line AssertionError every check uses: ``<what>: <rule>: <detail>``."""
    msg = f"{what}: {rule}: {detail}"
    raise AssertionError(msg)


def check_time_limit(what: str, call: str, label: str, start: float, time_limit_s: float) -> None:
    """Fail when ``call`` on input ``label``, begun at ``start`` (``time.monotonic()``), ran
    past ``time_limit_s``."""
    elapsed = time.monotonic() - start
    if elapsed > time_limit_s:
        fail(
            what,
            f"{call} must return within time_limit_s={time_limit_s:g}",
            f"{label}: took {elapsed:.2f} s",
        )


def name_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_number(value: Any) -> bool:
    """A finite real number that is not a bool (``True`` is an int, but not a score)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_subclass(cls: Any, base: type) -> None:
    if not (isinstance(cls, type) and issubclass(cls, base)):
        fail(
            repr(cls),
            f"must subclass rlcore.interfaces.{base.__name__}",
            f"got {cls!r}",
        )


def check_config(cls: type, config: Any, section: str) -> Any:
    """Check ``cls.Config`` against the config rules; return ``config`` or its defaults.

    Rules: an attrs class decorated itself (not only inheriting), frozen and keyword-only
    (``@attrs.frozen(kw_only=True)`` re-applied on the subclass); ``{}`` structures through
    rlcore's converter into a valid instance, apart from the required keys (fields without a
    default, ``key(help=...)``), which must be reported missing and nothing else; an unknown
    key is refused; instances pickle (they cross Ray and process pools).

    A ``Config`` with required keys has no defaults to build: pass ``config`` (an instance
    with them set, e.g. ``MyReward.Config(endpoint="http://127.0.0.1:8000")``) to the
    ``check_<kind>`` call; without it the check fails naming the keys.
    """
    what = name_of(cls)
    config_cls = getattr(cls, "Config", None)
    if not (isinstance(config_cls, type) and attrs.has(config_cls)):
        fail(what, "Config must be an attrs class (@attrs.frozen(kw_only=True))", repr(config_cls))
    if "__attrs_attrs__" not in vars(config_cls):
        own = sorted(vars(config_cls).get("__annotations__", {}))
        fail(
            what,
            "Config must be decorated with @attrs.frozen(kw_only=True) (a plain subclass of an "
            "attrs class silently drops its own fields)",
            f"{config_cls.__qualname__} is not decorated; fields {own} would be ignored",
        )
    positional = [f.name for f in attrs.fields(config_cls) if not f.kw_only]
    if positional:
        fail(
            what,
            "Config fields must be keyword-only (re-apply @attrs.frozen(kw_only=True) on the "
            "subclass; attrs does not inherit it)",
            f"positional fields {positional}",
        )
    required = {f.name for f in attrs.fields(config_cls) if f.default is attrs.NOTHING}
    defaults, problems = structure({}, config_cls, (section,))
    # A required key is reported missing (and nothing else is wrong with the empty table).
    missing = {p[-1] for p, m in problems if m == "missing required key" and len(p) > 1}
    problems = [(p, m) for p, m in problems if not (p[-1:] and p[-1] in required)]
    if problems or missing != required:
        text = "; ".join(f"{render_path(p)}: {m}" for p, m in problems) or (
            f"required keys {sorted(required)}, reported missing {sorted(missing)}"
        )
        fail(what, "Config defaults must structure and validate from an empty table", text)
    if required and config is None:
        fail(
            what,
            "a Config with required keys needs config= (an instance with them set)",
            f"required keys {', '.join(sorted(required))}",
        )
    instance = defaults if defaults is not None else config
    fields = attrs.fields(config_cls)
    probe = fields[0].name if fields else UNKNOWN_KEY
    try:
        setattr(instance, probe, getattr(instance, probe, None))
    except (attrs.exceptions.FrozenInstanceError, AttributeError):
        pass
    else:
        fail(what, "Config must be frozen (@attrs.frozen)", f"setting {probe!r} succeeded")
    _, problems = structure({UNKNOWN_KEY: 1}, config_cls, (section,))
    if not any(UNKNOWN_KEY in render_path(p) for p, _ in problems):
        fail(
            what,
            "Config must reject an unknown key through rlcore's config converter "
            "(forbid_extra_keys)",
            f"{{{UNKNOWN_KEY!r}: 1}} gave problems {problems}",
        )
    if config is None:
        config = defaults
    elif not isinstance(config, config_cls):
        fail(what, f"config must be a {config_cls.__qualname__}", f"got {type(config).__name__}")
    try:
        copy = pickle.loads(pickle.dumps(config))
    except Exception as err:  # any pickling failure is the finding
        fail(what, "Config instances must pickle (they cross Ray)", f"{type(err).__name__}: {err}")
    if copy != config:
        fail(what, "Config must compare equal after a pickle round trip", f"{copy!r} != {config!r}")
    return config
