"""A process pool for scoring, with a per-task time limit that survives stuck workers.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot cancel one running task, and a
worker stuck in C code (or with signals blocked) would hold the whole pool. Here each worker
publishes the id of the task it is on in shared memory (an 8-byte ``Value``, no message), and
sends results in batches (at the end of a chunk, or every ``FLUSH_S``) so that cheap scorers
are not dominated by messaging. The driver watches the published ids: a worker on the same task
for longer than ``timeout_s + grace_s`` is killed and replaced; that task scores 0 as a timeout
and the rest of its chunk goes back to the queue (results it had not sent yet are recomputed:
rewards are deterministic).

Inside a worker the ordinary limit is ``SIGALRM`` (a worker's loop runs on its main thread),
so the kill is only for what a signal cannot interrupt. Workers start with ``forkserver``
(``spawn`` where that is missing), never ``fork``: the driver holds Ray and torch threads.
Rewards travel to workers pickled, so their classes must be importable by module path.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from rlcore.interfaces import BaseReward
from rlcore.reward._scoring import Outcome, Task, alarm_handler, call_reward

__all__ = ["PoolBrokenError", "ScoringPool", "main_module_hidden"]

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # a worker unpickles rewards, which may import sympy & co.
FLUSH_S = 0.05  # a worker sends what it has at least this often


class PoolBrokenError(RuntimeError):
    """Workers cannot start (a reward fails to unpickle or import in a fresh process)."""


def _worker_main(conn: Connection, current: Any, rewards_blob: bytes, timeout_s: float) -> None:
    # Ctrl-C is the driver's to handle; it kills the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rewards = pickle.loads(rewards_blob)
    except Exception as err:
        conn.send(("fatal", f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", None))
    with alarm_handler():
        while True:
            try:
                chunk = conn.recv()
            except EOFError:  # the driver went away
                return
            if chunk is None:
                return
            done: list[tuple[int, Outcome]] = []
            last_flush = time.monotonic()
            for task in chunk:
                current.value = task[0]
                done.append((task[0], call_reward(rewards, task, timeout_s)))
                if time.monotonic() - last_flush >= FLUSH_S:
                    conn.send(("results", done))
                    done, last_flush = [], time.monotonic()
            current.value = -1
            conn.send(("results", done))


class _Worker:
    def __init__(self, proc: BaseProcess, conn: Connection, current: Any) -> None:
        self.proc = proc
        self.conn = conn
        self.current = current  # shared int64: the task id being scored, -1 when idle
        self.ready = False
        self.started = time.monotonic()
        self.inflight: collections.deque[Task] = collections.deque()
        # The task id last seen in ``current`` and since when (monotonic).
        self.seen_task = -1
        self.seen_since = 0.0


def _stop_workers(workers: list[_Worker]) -> None:
    for w in workers:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=5)
        w.conn.close()


class ScoringPool:
    """``num_workers`` processes scoring tasks; see the module docstring.

    ``run(tasks)`` returns one outcome per task, in order; ``None`` for tasks left undone
    because the pool broke (the caller scores those itself). Workers start on first use and
    persist across calls until :meth:`close`.
    """

    def __init__(
        self,
        rewards: Mapping[str, BaseReward],
        num_workers: int,
        timeout_s: float,
        grace_s: float | None = None,
        start_method: str | None = None,
    ) -> None:
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        # The worker's own alarm fires at timeout_s; the kill is the backstop.
        self.grace_s = grace_s if grace_s is not None else max(1.0, 0.5 * timeout_s)
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        self._ctx = multiprocessing.get_context(method)
        self._blob = pickle.dumps(dict(rewards))  # fails here, in the driver, if unpicklable
        # Rewards defined in the driver's script need that script imported in the worker.
        self._needs_main = b"__main__" in self._blob
        self._workers: list[_Worker] = []
        self.broken: str | None = None
        self.restarts = 0
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)

    # --- lifecycle --------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        current = self._ctx.Value("q", -1, lock=False)  # type: ignore[attr-defined]
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            args=(child, current, self._blob, self.timeout_s),
            name="rlcore-reward-worker",
            daemon=True,
        )
        with contextlib.nullcontext() if self._needs_main else main_module_hidden():
            proc.start()
        child.close()
        return _Worker(proc, parent, current)

    def _replace(self, w: _Worker) -> None:
        _stop_workers([w])
        self._workers[self._workers.index(w)] = self._spawn()
        self.restarts += 1

    def close(self) -> None:
        """Stop the workers (also done at garbage collection and interpreter exit)."""
        for w in self._workers:
            if w.proc.is_alive():
                with contextlib.suppress(OSError):  # already gone: killed below
                    w.conn.send(None)
        for w in self._workers:
            w.proc.join(timeout=2)
        _stop_workers(self._workers)
        self._workers.clear()

    # --- scoring ----------------------------------------------------------------------------

    def run(self, tasks: Sequence[Task], chunk_size: int | None = None) -> list[Outcome | None]:
        """Score ``tasks`` (their ids must be their positions 0..n-1)."""
        n = len(tasks)
        results: list[Outcome | None] = [None] * n
        if n == 0 or self.broken:
            return results
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())
        if chunk_size is None:
            # ~4 chunks per worker balances load; a cap keeps re-queued work small.
            chunk_size = max(1, min(256, -(-n // (4 * self.num_workers))))
        queue: collections.deque[list[Task]] = collections.deque(
            list(tasks[i : i + chunk_size]) for i in range(0, n, chunk_size)
        )
        remaining = n
        limit = self.timeout_s + self.grace_s
        try:
            while remaining:
                now = time.monotonic()
                for w in self._workers:  # hand out work
                    if w.ready and not w.inflight and queue:
                        chunk = queue.popleft()
                        w.conn.send(chunk)
                        w.inflight.extend(chunk)
                        w.seen_task, w.seen_since = -1, now
                waits = [
                    (w.seen_since + limit) if w.ready else (w.started + STARTUP_TIMEOUT_S)
                    for w in self._workers
                    if w.inflight or not w.ready
                ]
                wait_s = max(0.0, min(waits) - now) if waits else None
                handles: list[Any] = [w.conn for w in self._workers]
                handles += [w.proc.sentinel for w in self._workers]
                ready = set(multiprocessing.connection.wait(handles, timeout=wait_s))
                for w in list(self._workers):
                    remaining -= self._drain(w, ready, results, queue)
                    remaining -= self._watch(w, results, queue, limit)
                if self.broken:
                    raise PoolBrokenError(self.broken)
        except PoolBrokenError:
            log.warning("reward pool disabled, scoring in the driver: %s", self.broken)
            self.close()
        return results

    def _drain(
        self,
        w: _Worker,
        ready: set[Any],
        results: list[Outcome | None],
        queue: collections.deque[list[Task]],
    ) -> int:
        """Read what ``w`` sent; handle its death. Returns the number of tasks finished."""
        done = 0
        if w.conn in ready or w.proc.sentinel in ready:
            try:
                while w.conn.poll():
                    kind, payload = w.conn.recv()
                    if kind == "ready":
                        w.ready = True
                    elif kind == "fatal":
                        self.broken = f"a reward could not be rebuilt in a worker: {payload}"
                        return done
                    else:
                        for task_id, outcome in payload:
                            head = w.inflight.popleft()
                            if head[0] != task_id:  # pragma: no cover - protocol invariant
                                msg = f"reward worker answered task {task_id}, not {head[0]}"
                                raise RuntimeError(msg)
                            results[task_id] = outcome
                            done += 1
            except (EOFError, OSError):
                pass  # the process died; its sentinel says so below
        if w.proc.sentinel in ready and not w.proc.is_alive():
            if not w.ready:
                self.broken = f"a reward worker exited at start (code {w.proc.exitcode})"
            elif w.inflight:
                message = f"its worker died (exit code {w.proc.exitcode})"
                done += self._fail_current(w, results, queue, "error", message)
            else:
                self._replace(w)
        return done

    def _watch(
        self,
        w: _Worker,
        results: list[Outcome | None],
        queue: collections.deque[list[Task]],
        limit: float,
    ) -> int:
        """Kill ``w`` if it has been on one task past ``limit``; returns tasks finished."""
        now = time.monotonic()
        if not w.ready:
            if now - w.started > STARTUP_TIMEOUT_S:
                self.broken = f"a reward worker did not start in {STARTUP_TIMEOUT_S} s"
            return 0
        if not w.inflight or not w.proc.is_alive():
            return 0
        current = int(w.current.value)
        if current != w.seen_task:
            w.seen_task, w.seen_since = current, now
            return 0
        if now - w.seen_since <= limit:
            return 0
        message = f"ran past {self.timeout_s} s; its worker was killed"
        return self._fail_current(w, results, queue, "timeout", message)

    def _fail_current(
        self,
        w: _Worker,
        results: list[Outcome | None],
        queue: collections.deque[list[Task]],
        status: str,
        message: str,
    ) -> int:
        """Score ``w``'s current task 0, requeue the rest of its chunk, replace ``w``."""
        current = int(w.current.value)
        ids = [t[0] for t in w.inflight]
        task = w.inflight[ids.index(current)] if current in ids else w.inflight[0]
        elapsed = time.monotonic() - w.seen_since
        text = f"reward {task[1]!r}: {message}"
        if status == "timeout":
            results[task[0]] = ("timeout", 0.0, {}, text, elapsed)
        else:
            results[task[0]] = ("error", 0.0, {}, text, elapsed)
        rest = [t for t in w.inflight if t[0] != task[0]]
        w.inflight.clear()
        if rest:
            queue.appendleft(rest)
        self._replace(w)
        return 1


# The __main__ swap below is process-wide: one process start at a time may hold it (the
# reward pool's workers and the agent's tool processes start from different threads).
_MAIN_SWAP_LOCK = threading.Lock()


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start processes without re-running the driver's ``__main__`` script in them.

    ``forkserver`` and ``spawn`` import the parent's main script in each child (and in the
    fork server), so a driver script without an ``if __name__ == "__main__":`` guard (or
    Ray's worker script) would run again there. The children need nothing from it (their
    targets live in importable modules; ``_needs_main`` keeps the import for rewards defined
    in the script), so the main module is swapped for an empty one while the process starts.
    Used by the reward pool and by :mod:`rlcore.agent.tool_processes`.
    """
    with _MAIN_SWAP_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main
