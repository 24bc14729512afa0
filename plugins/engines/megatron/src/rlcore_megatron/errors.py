"""The megatron engine's error."""

from __future__ import annotations

from rlcore.errors import EngineError

__all__ = ["MegatronError"]


class MegatronError(EngineError):
    """The megatron engine cannot do what was asked (missing checkpoint, wrong role, ...)."""
