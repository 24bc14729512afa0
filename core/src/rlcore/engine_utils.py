"""Deprecated: the engine helpers are the package :mod:`rlcore.engine` now, one module per job.

This module only re-exports their names, for plugins written against ``rlcore.engine_utils``;
import from ``rlcore.engine`` (or its modules) instead. It will go in a later release.
"""

from __future__ import annotations

import warnings

from rlcore.engine import *  # noqa: F403
from rlcore.engine import __all__ as __all__

warnings.warn(
    "rlcore.engine_utils is deprecated: import the same names from rlcore.engine",
    DeprecationWarning,
    stacklevel=2,
)
