"""What the config sections share: their validators, the default of a key the loader resolves
(:data:`RESOLVED`) and the micro-batch keys' help."""

from __future__ import annotations

import math
from typing import Any

import attrs
from attrs import validators as v

# Merged into the parent table when dumped: the plugin's options sit next to ``name``.
_FLATTEN = {"flatten": True}

_pos = v.ge(1)
_opt_pos = v.optional(v.ge(1))


def _finite(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not math.isfinite(value):
        msg = f"must be finite, got {value}"
        raise ValueError(msg)


# The default of a field the loader resolves from other keys; typed ``Any`` so the field keeps
# its resolved type (``str``, not ``str | None``) for everyone who reads a loaded config.
RESOLVED: Any = None


def _nonempty(_inst: object, _attr: attrs.Attribute[Any], value: str | tuple[str, ...]) -> None:
    if not value:
        msg = "must not be empty"
        raise ValueError(msg)


# Micro-batching of a role that trains or scores a model (actor, ref, critic, roles).
_MICRO_HELP = (
    "Rows per data-parallel rank in one forward/backward micro-batch. Set this or "
    "max_tokens_per_micro_batch, not both; neither set: a token budget of 16384 "
    "(the actor's) or, for ref/critic/roles, the actor's setting."
)
_MAX_TOKENS_HELP = (
    "Token budget (prompt + response, padded) of one micro-batch per rank: as many rows "
    "as fit (dynamic micro-batches). Set this or micro_batch_size, not both."
)

ROLES = "roles"  # [roles.<name>]: a table of extra roles, not one section
