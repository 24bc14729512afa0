"""Each tool call in a process of its own, killed from outside when it runs past its limit.

A tool is plugin code run on model output. In a thread of the policy worker it could not be
stopped: a call stuck in one C call (a regex backtracking, ``sum(range(10**12))``, a foreign
function) holds the GIL, so no Python-level timeout fires, and a ``SystemExit`` or
``KeyboardInterrupt`` it raises would end the worker. Here the call runs in a child process
(``forkserver``, ``spawn`` where that is missing; never ``fork``: the worker holds torch and
Ray threads), the parent waits on a pipe for at most ``timeout_s`` and SIGKILLs the child
past it; whatever the child raises, ``BaseException`` included, comes back as text.

The limit starts when the child reports that the tool is loaded: process start-up and the
tool's imports (bounded by :data:`STARTUP_TIMEOUT_S`) are not the tool's time. Tools travel
to the child pickled (:func:`rlcore.testing.conformance.check_tool` requires that), so their
classes must be importable by module path.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import signal
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any, Final

import attrs

from rlcore.errors import ConfigError
from rlcore.interfaces import BaseTool, ToolError
from rlcore.reward.pool import main_module_hidden

__all__ = [
    "DIED",
    "FAILED",
    "OK",
    "STARTUP_TIMEOUT_S",
    "TIMEOUT",
    "TOOL_ERROR",
    "ToolOutcome",
    "ToolProcesses",
]

STARTUP_TIMEOUT_S: Final = 60.0  # a fresh process unpickles the tool, which may import a lot
_KILL_WAIT_S: Final = 5.0  # SIGKILL is not refused; this only bounds the reaping

# How a call ended; each kind but "ok" is an error shown to the model and counted.
OK, TOOL_ERROR, FAILED, TIMEOUT, DIED = "ok", "tool_error", "failed", "timeout", "died"


@attrs.frozen
class ToolOutcome:
    """What one call gave: ``text`` for the model, and ``kind`` (one of ``ok``,
    ``tool_error`` (the tool's :class:`ToolError`), ``failed`` (anything else it raised, or a
    non-text answer), ``timeout`` (killed at its limit) and ``died`` (its process ended
    without an answer, or did not start))."""

    text: str
    kind: str

    @property
    def ok(self) -> bool:
        return self.kind == OK


def _child(conn: Connection, blob: bytes, arguments: Any, max_chars: int) -> None:
    # Ctrl-C is the parent's to handle; it kills this process itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        tool = pickle.loads(blob)
    except BaseException as err:  # reported to the parent; the process ends
        conn.send((DIED, f"could not be loaded in its process: {type(err).__name__}: {err}"))
        return
    conn.send(("started", None))
    try:
        out = tool.call(arguments)
    except ToolError as err:
        conn.send((TOOL_ERROR, str(err)))
    except BaseException as err:  # SystemExit, KeyboardInterrupt too: data for the model
        conn.send((FAILED, f"{type(err).__name__}: {err}"))
    else:
        if isinstance(out, str):
            conn.send((OK, out[: max_chars + 1]))  # one more: the parent sees it was longer
        else:
            conn.send((FAILED, f"returned {type(out).__name__}, not text"))


def _receive(conn: Connection, timeout_s: float) -> tuple[str, Any] | None:
    """The child's next message; None if none came within ``timeout_s``; ``(DIED, None)`` if
    its end of the pipe closed (the process ended) first."""
    if not conn.poll(timeout_s):
        return None
    try:
        message = conn.recv()
    except (EOFError, OSError):
        return DIED, None
    return message if isinstance(message, tuple) and len(message) == 2 else (DIED, None)


class ToolProcesses:
    """Runs ``call(name, arguments, ...)`` of the given tools, each call in a new process.

    ``tools`` by name; each is pickled once here, so a tool that cannot travel is a
    :class:`~rlcore.errors.ConfigError` naming it when the loop is built, not an error at
    every call.
    """

    def __init__(self, tools: Mapping[str, BaseTool], start_method: str | None = None) -> None:
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        self._ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            # Imported once in the fork server, if this starts it, instead of in every call's
            # process (a tool module that imports torch would cost seconds per call). No
            # "__main__": the server must not run the parent's script. A module that fails
            # to import there is skipped by multiprocessing and imported per call instead.
            modules = {type(t).__module__ for t in tools.values()} - {"__main__"}
            self._ctx.set_forkserver_preload([__name__, *sorted(modules)])
        self._blobs: dict[str, bytes] = {}
        for name, tool in tools.items():
            try:
                self._blobs[name] = pickle.dumps(tool)
            except Exception as err:  # any pickling failure names the tool
                cls = type(tool)
                msg = (
                    f"tool {name!r} ({cls.__module__}:{cls.__qualname__}) cannot be sent to "
                    f"the process its calls run in: it does not pickle ({type(err).__name__}: "
                    f"{err}); keep only picklable state on the tool (see [agent] tools)"
                )
                raise ConfigError(msg) from err

    def call(
        self, name: str, arguments: Mapping[str, Any], *, timeout_s: float, max_chars: int
    ) -> ToolOutcome:
        """Run tool ``name`` on ``arguments`` in a new process; never raises, and returns
        within ``STARTUP_TIMEOUT_S + timeout_s`` and the reaping of a killed child."""
        blob = self._blobs[name]
        parent, child = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=_child,
            args=(child, blob, dict(arguments), max_chars),
            name=f"rlcore-tool-{name}"[:64],
            daemon=True,
        )
        try:
            with contextlib.nullcontext() if b"__main__" in blob else main_module_hidden():
                proc.start()
        except Exception as err:  # no process (fork limits, memory): this call fails only
            parent.close()
            child.close()
            return ToolOutcome(f"tool {name!r} could not start: {type(err).__name__}: {err}", DIED)
        child.close()
        try:
            message = _receive(parent, STARTUP_TIMEOUT_S)
            if message is None:
                return ToolOutcome(
                    f"tool {name!r} did not start within {STARTUP_TIMEOUT_S:g} s", DIED
                )
            if message[0] == "started":
                message = _receive(parent, timeout_s)
                if message is None:
                    return ToolOutcome(
                        f"tool {name!r} did not answer within {timeout_s} s", TIMEOUT
                    )
            return self._outcome(name, message, proc)
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(_KILL_WAIT_S)
            parent.close()

    @staticmethod
    def _outcome(name: str, message: tuple[str, Any], proc: Any) -> ToolOutcome:
        kind, payload = message
        if kind == OK and isinstance(payload, str):
            return ToolOutcome(payload, OK)
        if kind == TOOL_ERROR:
            return ToolOutcome(str(payload), TOOL_ERROR)
        if kind == FAILED:
            return ToolOutcome(f"tool {name!r} failed: {payload}", FAILED)
        if payload is not None:
            return ToolOutcome(f"tool {name!r} {payload}", DIED)
        proc.join(_KILL_WAIT_S)  # it closed its pipe: it is ending; its code says how
        return ToolOutcome(
            f"tool {name!r} ended its process without an answer (exit code {proc.exitcode})",
            DIED,
        )
