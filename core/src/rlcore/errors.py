"""One error hierarchy for everything rlcore raises on purpose.

The CLI turns any ``RlcoreError`` into one line on stderr and exit code 2; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import os
from pathlib import Path


class RlcoreError(Exception):
    """Base of every error rlcore raises for a condition the user can act on."""


class ConfigError(RlcoreError):
    """A configuration file or override is invalid; the message names the key path."""


class PluginError(RlcoreError):
    """A plugin is unknown, duplicated, or could not be imported."""


class DataError(RlcoreError):
    """A data file is missing, unreadable, empty, or lacks a required field."""


class DataProtoError(RlcoreError, ValueError, AssertionError):
    """A DataProto operation got inconsistent inputs (length mismatch, conflict, uneven chunk).

    Also an ``AssertionError``: verl's DataProto fails its ``assert`` statements, and ported code
    that catches ``AssertionError`` keeps working.
    """


class RewardError(RlcoreError):
    """A batched reward scorer failed or broke its contract (raised, ran past
    ``reward.batch_timeout_s``, returned the wrong shape); the message names the scorer."""


class EngineError(RlcoreError):
    """A training engine cannot do what was asked (no optimizer, an empty batch, a missing
    checkpoint, ...); the message names the role. Engine plugins subclass it."""


class ResourceError(RlcoreError):
    """The cluster cannot hold what the configuration asks for."""


class WorkerError(RlcoreError):
    """A remote worker failed; the message names role and rank. An unexpected exception carries
    the remote traceback; an :class:`RlcoreError` raised in the worker (a condition the user can
    act on, e.g. a config key only the worker could check) is its own one line.

    ``remote_cause``: the exception the worker raised, when Ray delivered it (None otherwise).
    """

    remote_cause: BaseException | None = None


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A call, an actor start or a placement did not finish within its configured timeout.

    The message names the group, role, ranks still pending, what was waited for and the setting
    that bounds it (e.g. ``resources.call_timeout_s``).
    """


class WorkerLostError(WorkerError):
    """A worker process is gone: it died (SIGKILL, OOM: Ray reports the actor dead) or stopped
    responding (its heartbeat stood still, :mod:`rlcore.workers.liveness`).

    Unlike a worker's own exception (which would recur if the call were repeated), the process
    is what failed, so a run may replace it (``trainer.max_worker_restarts``,
    docs/fault-tolerance.md). ``role``: the worker group's role, as the message names it.
    """

    role: str | None = None


class WorkerGroupError(RlcoreError, ValueError):
    """A worker group was set up wrong (e.g. a runtime_env overriding a protected variable)."""


def require_file(
    path: str | os.PathLike[str],
    what: str,
    *,
    error: type[RlcoreError],
    where: str = "",
    hint: str = "",
) -> Path:
    """``path`` when it is an existing file; else ``error`` with the one line every user-given
    file gets: ``"{where}: {what} {path} does not exist{hint}"`` (or ``"... {path} is not a
    file"``), ``where`` the config key that named it (none: no prefix)."""
    file = Path(path)
    if file.is_file():
        return file
    prefix = f"{where}: " if where else ""
    if file.exists():
        msg = f"{prefix}{file} is not a file{hint}"
    else:
        msg = f"{prefix}{what} {file} does not exist{hint}"
    raise error(msg)
