"""Elastic rollout capacity: ``rlcore scale RUN_DIR rollout=N`` and the driver's side of it.

The command writes a control file, ``<run_dir>/scale.json`` (``{"rollout": N, "id": ...,
"time": ...}``, written whole: a temporary file, then ``os.replace``), and the driver of a
running ``rlcore train`` reads it between steps (:class:`ScaleWatcher`). A file, not a
command port: nothing listens on a socket, the command needs no address of the driver, and a
request outlives the driver: a run that restarts its workers (a recovery from a checkpoint)
or is resumed by hand reads it again and scales its fresh fleet to the same count. Each
request (its id) is acted on once per fleet, so a replica lost for good is not started again
behind the user's back (``rlcore scale`` again does that).

Scaling needs the rollout on a pool of its own and an asynchronous mode
(``resources.placement = { rollout = "..." }``, ``trainer.async_mode`` ``"one_step_off"`` or
``"fully_async"``): the fleet is :class:`~rlcore.trainer.placement.SplitPolicy`'s replicas,
and only the trajectory queue has batches to spread over them.
"""

from __future__ import annotations

import json
import logging
import os
import time
import tomllib
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from rlcore.errors import ConfigError

if TYPE_CHECKING:
    from rlcore.trainer.placement import SplitPolicy

log = logging.getLogger(__name__)

__all__ = ["SCALE_FILE", "ScaleRequest", "ScaleWatcher", "parse_scale", "request_scale"]

SCALE_FILE = "scale.json"
RUN_CONFIG = "config.toml"  # the resolved config rlcore train writes into its run directory
_ASYNC_MODES = ("one_step_off", "fully_async")


@attrs.frozen
class ScaleRequest:
    """The replica count asked for, the request's id and when it was written (Unix time)."""

    rollout: int
    id: str
    time: float


def parse_scale(assignment: str) -> int:
    """``rollout=N`` (N a positive integer) to N, or one line naming what to fix."""
    key, sep, value = assignment.partition("=")
    if not sep or key.strip() != "rollout":
        msg = f"rlcore scale: expected rollout=N (the rollout replicas wanted), got {assignment!r}"
        raise ConfigError(msg)
    try:
        count = int(value.strip())
    except ValueError:
        count = 0
    if count < 1:
        msg = f"rlcore scale: rollout= takes a positive integer (replicas), got {value.strip()!r}"
        raise ConfigError(msg)
    return count


def _check_run_dir(run_dir: Path) -> None:
    """One line unless ``run_dir`` is a run directory whose rollout can be scaled."""
    config = run_dir / RUN_CONFIG
    if not config.is_file():
        msg = (
            f"rlcore scale: {run_dir} is not a run directory (no {RUN_CONFIG}); give the "
            "run's trainer.run_dir"
        )
        raise ConfigError(msg)
    try:
        text = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        msg = f"rlcore scale: {config} cannot be read as TOML ({err})"
        raise ConfigError(msg) from err
    trainer, resources = text.get("trainer") or {}, text.get("resources") or {}
    mode = trainer.get("async_mode", "off")
    pool = (resources.get("placement") or {}).get("rollout")
    colocated = not pool or pool == "global_pool"
    if mode not in _ASYNC_MODES or colocated:
        msg = (
            f"rlcore scale: the run in {run_dir} is {'colocated' if colocated else 'synchronous'} "
            f"(trainer.async_mode = {mode!r}, resources.placement.rollout = {pool!r}); scaling "
            'needs the rollout on its own pool (resources.placement = { rollout = "gen" } '
            'with [resources.pools.gen]) and trainer.async_mode = "one_step_off" or "fully_async"'
        )
        raise ConfigError(msg)


def request_scale(run_dir: Path, rollout: int) -> ScaleRequest:
    """Write the control file of ``run_dir`` asking for ``rollout`` replicas (atomically)."""
    _check_run_dir(run_dir)
    request = ScaleRequest(rollout=rollout, id=uuid.uuid4().hex, time=time.time())
    tmp = run_dir / f".{SCALE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(attrs.asdict(request)) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / SCALE_FILE)
    return request


def read_request(path: Path) -> ScaleRequest | None:
    """The control file's request; None when there is none (or it cannot be read: said once
    per bad content by the watcher)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        request = ScaleRequest(
            rollout=int(raw["rollout"]), id=str(raw["id"]), time=float(raw["time"])
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as err:
        msg = (
            f"{path}: not a scale request ({type(err).__name__}: {err}); write it with rlcore scale"
        )
        raise ConfigError(msg) from err
    if request.rollout < 1:
        msg = f"{path}: rollout = {request.rollout}, a positive count is needed (rlcore scale)"
        raise ConfigError(msg)
    return request


class ScaleWatcher:
    """The driver's reader of ``<run_dir>/scale.json``, polled between steps."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / SCALE_FILE
        self._bad: str | None = None  # the last unreadable content's line (said once)

    def poll(self, policy: SplitPolicy) -> None:
        """Act on a request the fleet has not seen (its id): scale ``policy`` to its count."""
        try:
            request = read_request(self.path)
        except ConfigError as err:
            if str(err) != self._bad:
                log.warning("%s", err)
                self._bad = str(err)
            return
        if request is None or request.id == policy.applied_request:
            return
        policy.applied_request = request.id
        log.info(
            "scale request %s: rollout replicas %d -> %d",
            request.id[:8],
            len(policy.replicas),
            request.rollout,
        )
        policy.scale_to(request.rollout)
