"""Helpers of :mod:`rlcore.workers.worker_group`: reading Ray's errors and actor states, and
checking a reported mesh."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from rlcore.dispatch import DispatchError, DispatchInfo

log = logging.getLogger("rlcore.workers.worker_group")


def _plain(err: BaseException) -> str:
    """Ray's message without its terminal colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(err))


def _death_cause(text: str) -> str:
    """The cause in Ray's actor-death message, e.g. ``exit SYSTEM_ERROR: Worker unexpectedly
    exits with a connection error code 2. End of file. (killed, out of memory or crashed)``."""
    found = re.search(
        r"Worker exit type: (\S+) Worker exit detail: (.*?)(?: Some common causes| There are"
        r" some potential root causes|$)",
        text,
        re.S,
    )
    if found is None:
        return _first_line(text)
    kind, detail = found.group(1), " ".join(found.group(2).split())
    if kind == "SYSTEM_ERROR":
        detail += " (the process was killed, ran out of memory or crashed)"
    return f"exit {kind}: {detail}"


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _check_mesh(role: str, mesh: str, infos: list[DispatchInfo]) -> None:
    sizes = {i.dp_size for i in infos}
    if len(sizes) != 1:
        msg = f"role {role}: ranks disagree on dp_size in mesh {mesh!r}: {sorted(sizes)}"
        raise DispatchError(msg)
    dp = sizes.pop()
    collect = sorted(i.dp_rank for i in infos if i.is_collect)
    if collect != list(range(dp)):
        msg = (
            f"role {role}: mesh {mesh!r} needs exactly one collect rank per data-parallel rank "
            f"0..{dp - 1}, got collect ranks for dp ranks {collect}"
        )
        raise DispatchError(msg)


# Ray actor states before the actor process runs its __init__ (GCS actor table names).
_UNPLACED_STATES = frozenset({"DEPENDENCIES_UNREADY", "PENDING_CREATION"})


def _actor_state(actor: Any) -> tuple[str | None, int]:
    """The actor's state in Ray's actor table and its pid (0 while it has no process).

    An actor is ``PENDING_CREATION`` both while it waits for resources and while its
    ``__init__`` runs; only the pid tells them apart. Uses ``ray._private.state.actors``,
    which reads the GCS directly and needs no dashboard; a Ray that changed it gives
    ``(None, 0)`` and the error just says less.
    """
    try:
        from ray._private import state

        info = state.actors(actor_id=actor._actor_id.hex())
        if isinstance(info, dict):
            return str(info.get("State")), int(info.get("Pid") or 0)
    except Exception:  # pragma: no cover - private API of one Ray version
        log.debug("no actor state from Ray", exc_info=True)
    return None, 0


def _fmt_share(share: Mapping[str, float]) -> str:
    text = f"{share['num_cpus']:g} CPU"
    if share.get("num_gpus"):
        text += f" + {share['num_gpus']:g} GPU"
    return text
