"""A safetensors file's JSON header, read without loading a tensor, after checking that the file
holds all the data the header describes (a 0-byte or truncated download is named).

Checkpoint verification and the preflight checks of a model folder both use it.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from rlcore.errors import ConfigError

__all__ = ["read_safetensors_header"]

_HEADER_LIMIT = 100 * 2**20  # safetensors caps its JSON header at 100 MB


def read_safetensors_header(file: Path, key: str) -> dict[str, Any]:
    """The JSON header of a safetensors file, after checking the file holds all its data."""
    try:
        size = file.stat().st_size
        with file.open("rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            raw = fh.read(n) if 0 < n <= _HEADER_LIMIT else b""
    except OSError as err:
        msg = f"{key}: cannot read {file} ({err.strerror or err})"
        raise ConfigError(msg) from err
    fix = "download or save the model again"
    if size < 8 or n <= 0 or n > _HEADER_LIMIT or len(raw) < n:
        msg = f"{key}: {file} is not a complete safetensors file ({size} bytes); {fix}"
        raise ConfigError(msg)
    try:
        header = json.loads(raw)
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        msg = f"{key}: {file} has a damaged safetensors header ({type(err).__name__}); {fix}"
        raise ConfigError(msg) from err
    need = 8 + n + max(ends, default=0)
    if size < need:
        msg = f"{key}: {file} is truncated ({size} bytes, its header describes {need}); {fix}"
        raise ConfigError(msg)
    return dict(header)
