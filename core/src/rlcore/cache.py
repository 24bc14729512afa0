"""Where rlcore keeps what it computes once per machine (converted GGUF models, the measured
matmul peak): ``$RLCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlcore``, else ``~/.cache/rlcore``.
Read from the environment at each call, so a test or a run may point it elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir"]

CACHE_ENV = "RLCORE_CACHE_DIR"


def cache_dir(kind: str) -> Path:
    """The folder for one kind of cached thing (not created here)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser() / kind
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "rlcore" / kind
