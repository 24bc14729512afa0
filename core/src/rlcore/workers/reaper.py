"""A private local Ray does not outlive its driver by more than a second or two, even SIGKILLed.

``ray.init()`` starts the GCS and the raylet tied to the driver (Linux ``PR_SET_PDEATHSIG``),
and the workers follow the raylet; but the raylet's two agents (``ray::DashboardAgent`` and
the runtime-env agent), once they see it gone, report its death to the GCS with a fixed 60 s
timeout (``ray._private.utils.publish_error_to_driver``) — and the GCS died with the driver. So
after a driver-only SIGKILL they lived about 60 s more (issue 31, item 10); Ray offers no
setting for that timeout.

:func:`start_reaper` (called by ``rlcore train`` once it started a private Ray) runs this
module as a small process that reads the driver's pipe: it learns the pids of the processes
Ray started, snapshots them and their descendants every :data:`SNAPSHOT_S` seconds while the
driver lives, and when the pipe closes (the driver exited, however) sends SIGKILL to every
process of the last snapshot still running (matched by start time, so a reused pid is left
alone), then exits. It ignores SIGINT and SIGTERM: a signal to the whole process group is the
driver's to handle. It reads only ``/proc`` and kills only what the driver's Ray started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

__all__ = ["SNAPSHOT_S", "start_reaper"]

SNAPSHOT_S = 1.0


def _stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, start time)`` of ``pid``, None when it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def _tree(roots: Iterable[int]) -> dict[int, int]:
    """``pid -> start time`` of ``roots`` and all their descendants that are running."""
    parents: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                parents[int(entry)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    stack = [r for r in roots if r in parents]
    while stack:
        pid = stack.pop()
        if pid in out:
            continue
        out[pid] = parents[pid][1]
        stack.extend(children.get(pid, ()))
    return out


def _kill(snapshot: dict[int, int]) -> list[int]:
    killed = []
    for pid, started in snapshot.items():
        found = _stat(pid)
        if found is not None and found[1] == started and pid != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def _ray_roots() -> list[int]:
    """The pids of the processes this driver's Ray node started (GCS, raylet, monitors)."""
    import ray._private.worker as ray_worker

    node: Any = getattr(ray_worker, "_global_node", None)
    out = []
    for infos in (getattr(node, "all_processes", None) or {}).values():
        for info in infos:
            pid = getattr(getattr(info, "process", None), "pid", None)
            if isinstance(pid, int):
                out.append(pid)
    return out


def start_reaper() -> subprocess.Popen[bytes] | None:
    """Start the reaper for the private Ray this process started (see the module doc);
    None where ``/proc`` is missing or Ray's processes cannot be found."""
    if not Path("/proc/self/stat").exists():
        return None
    roots = _ray_roots()
    if not roots:
        return None
    proc = subprocess.Popen(  # this interpreter, this module
        [sys.executable, "-m", "rlcore.workers.reaper"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        close_fds=True,
    )
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(roots) + "\n").encode())
    proc.stdin.flush()
    return proc  # its stdin closes when this process exits, whatever ends it


def _run(pipe: IO[bytes]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    line = pipe.readline()
    if not line:
        return 0
    known = _tree(int(p) for p in json.loads(line))
    fd = pipe.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], SNAPSHOT_S)
        if ready and not os.read(fd, 4096):  # EOF: the driver is gone
            break
        # Still the same processes (a pid reused since is not ours), and what they started.
        alive = {p: s for p, s in known.items() if (_stat(p) or (0, -1))[1] == s}
        known = alive | _tree(alive)
    _kill(known)
    return 0


if __name__ == "__main__":
    sys.exit(_run(sys.stdin.buffer))
