"""rlcore: RL post-training for LLMs, a single-process driver loop over Ray workers.

Importing ``rlcore`` is light: torch and Ray are imported only when a name that needs them is
first used (``rlcore.DataProto`` imports torch then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlcore.errors import (
    ConfigError,
    DataError,
    DataProtoError,
    PluginError,
    ResourceError,
    RlcoreError,
    WorkerError,
)

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataError",
    "DataProto",
    "DataProtoError",
    "PluginError",
    "ResourceError",
    "RlcoreError",
    "WorkerError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Lazy: DataProto pulls in torch, which plugin discovery and `rlcore --help` must not pay for.
    if name == "DataProto":
        from rlcore.protocol import DataProto

        return DataProto
    msg = f"module 'rlcore' has no attribute {name!r}"
    raise AttributeError(msg)
