"""Fault injection: kill, stop or slow one worker process at a chosen phase of a chosen step.

Every recovery path of a run (docs/fault-tolerance.md) is exercised through this one harness.
A fault is a real signal sent by the driver to the worker's process (its pid from the worker
group's ``process_info``), from a timer started when the driver enters the phase, so it lands
while the phase's call runs in the worker (``delay_s`` after the phase starts):

- ``kill``: ``SIGKILL``, as the kernel's OOM killer would (Ray reports the actor dead);
- ``stop``: ``SIGSTOP`` and nothing after (a wedged process: its heartbeat stands still);
- ``slow``: ``SIGSTOP``, then ``SIGCONT`` after ``slow_s`` (a straggler that comes back).

The driver reads the faults from the environment variable ``RLCORE_FAULTS`` (the driver's
own: Ray workers need not see it, so it works in a Ray session started earlier). Faults are
separated by ``;``, each a comma-separated list of ``key=value``::

    RLCORE_FAULTS="action=kill,role=rollout,rank=0,phase=gen,step=3;action=kill,role=actor,phase=update_actor,step=5"

``role``: ``actor``, ``rollout``, ``ref``, ``critic``, or an extra role's name (colocated roles
share one process: killing the ``rollout`` of a colocated run kills the actor with it);
``phase``: a phase of the step program (``gen``, ``old_log_prob``, ``ref``, ``values``,
``reward``, ``adv``, ``update_actor``, ``update_critic``; the weight sync to a rollout on its
own pool runs inside ``update_actor``); ``step``: the step being trained (1-based);
``rank`` defaults to 0 (the rollout's ranks count over its replicas in order, see
``rlcore scale``), ``delay_s`` to 0.2, ``slow_s`` to 5. Each fault fires once per
driver, even when its step is trained again after a recovery. Signals reach processes on
the driver's node only.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from rlcore.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["FAULTS_ENV", "Fault", "FaultInjector", "fault_env", "parse_faults"]

FAULTS_ENV = "RLCORE_FAULTS"
ACTIONS = ("kill", "stop", "slow")


@attrs.frozen(kw_only=True)
class Fault:
    """One injected fault (module docstring)."""

    action: str = attrs.field(validator=attrs.validators.in_(ACTIONS))
    role: str
    phase: str
    step: int
    rank: int = 0
    delay_s: float = 0.2
    slow_s: float = 5.0

    def text(self) -> str:
        """This fault as one entry of ``RLCORE_FAULTS``."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in attrs.fields(Fault))


def fault_env(*faults: Fault) -> str:
    """The value of ``RLCORE_FAULTS`` that injects ``faults``."""
    return ";".join(f.text() for f in faults)


def parse_faults(text: str) -> list[Fault]:
    """``RLCORE_FAULTS``'s value as faults; a malformed entry is one :class:`ConfigError`."""
    kinds: dict[str, Callable[[str], Any]] = {
        "step": int,
        "rank": int,
        "delay_s": float,
        "slow_s": float,
    }
    out = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        try:
            fields = dict(item.split("=", 1) for item in entry.split(","))
            values = {k.strip(): kinds.get(k.strip(), str)(v.strip()) for k, v in fields.items()}
            out.append(Fault(**values))
        except (TypeError, ValueError) as err:
            msg = (
                f"{FAULTS_ENV}: cannot read {entry!r} ({err}); write "
                "action=kill|stop|slow,role=NAME,phase=NAME,step=N[,rank=N,delay_s=S,slow_s=S]"
            )
            raise ConfigError(msg) from err
    return out


class FaultInjector:
    """Fires each :class:`Fault` once, when the driver enters its phase of its step.

    ``resolve(role)``: the role's ``process_info`` (one mapping per rank with ``pid`` and
    ``node_ip``), looked up when the fault fires (a replaced worker has a new pid).
    """

    def __init__(
        self,
        faults: Sequence[Fault],
        resolve: Callable[[str], Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        self.faults = list(faults)
        self.resolve = resolve
        self.fired: list[tuple[Fault, int]] = []  # (fault, pid) in firing order
        self.step = 0
        self._done: set[int] = set()
        self._timers: list[threading.Thread] = []

    @classmethod
    def from_env(cls) -> FaultInjector | None:
        """The faults ``RLCORE_FAULTS`` names; None when it is unset or empty."""
        faults = parse_faults(os.environ.get(FAULTS_ENV, ""))
        if faults:
            log.warning("fault injection (%s): %s", FAULTS_ENV, fault_env(*faults))
        return cls(faults) if faults else None

    def at_phase(self, phase: str, step: int | None = None) -> None:
        """The driver enters ``phase`` of ``step`` (None: the step of the last call)."""
        if step is not None:
            self.step = step
        for i, fault in enumerate(self.faults):
            if i in self._done or fault.step != self.step or fault.phase != phase:
                continue
            self._done.add(i)
            # In order: a stop that lands while an earlier slow fault still sleeps would be
            # undone by that fault's SIGCONT (each thread ends within delay_s + slow_s).
            self.join(max(f.delay_s + f.slow_s for f in self.faults) + 5.0)
            thread = threading.Thread(target=self._fire, args=(fault,), daemon=True)
            thread.start()
            self._timers.append(thread)

    def _fire(self, fault: Fault) -> None:
        import time

        from rlcore.workers.worker import node_ip_address

        time.sleep(fault.delay_s)
        if self.resolve is None:
            log.error("fault %s: no workers bound to the injector", fault.text())
            return
        info = self.resolve(fault.role)[fault.rank]
        pid = int(info["pid"])
        if str(info.get("node_ip", "")) not in ("", node_ip_address(), "127.0.0.1"):
            log.error("fault %s: pid %d runs on another node", fault.text(), pid)
            return
        log.warning("fault injected: %s -> pid %d", fault.text(), pid)
        self.fired.append((fault, pid))
        try:
            if fault.action == "kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                if fault.action == "slow":
                    time.sleep(fault.slow_s)
                    os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            log.warning("fault %s: pid %d had already exited", fault.text(), pid)

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for the faults fired so far (their delays, a ``slow`` fault's pause), each at
        most ``timeout_s``; one still running after it is logged."""
        for thread in self._timers:
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning(
                    "fault injection: a fault's signal thread still runs after %.1f s", timeout_s
                )
