"""Names of a checkpoint directory's parts, shared by the manager and the safety checks.

The manager (:mod:`rlcore.checkpoint.manager`) and the safety checks
(:mod:`rlcore.checkpoint.safe_load`) both read them; neither imports the other for them.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlcore.errors import RlcoreError

CHECKPOINTS_DIR = "checkpoints"  # under the run directory
LATEST_FILE = "latest"
COMPLETE_MARKER = "COMPLETE"
CONFIG_FILE = "config.toml"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng_state.pt"
ACTOR_DIR = "actor"
CRITIC_DIR = "critic"

_STEP_PREFIX = "global_step_"
_STEP_RE = re.compile(r"global_step_(\d+)")
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


class CheckpointError(RlcoreError):
    """A checkpoint is missing, incomplete or unreadable; the message names the path."""


def step_of(path: Path) -> int | None:
    """The step of a ``global_step_<N>`` directory name, else None."""
    m = _STEP_RE.fullmatch(path.name)
    return int(m[1]) if m else None
