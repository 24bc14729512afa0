"""Trackers behind time bounds: their destinations checked before Ray, their calls waited for
at most ``[trainer] logger_timeout_s``.

A tracking service that stops answering must cost its own metrics, never the run: every call
of a logger runs on a daemon thread of its own (:class:`BoundedCall`), which the driver waits
for at most the bound; a call that never returns holds only that thread, which dies with the
process. Before Ray starts, :func:`rlcore.preflight.trackers.check_loggers` asks each
selected logger whether its destination can take the run
(:meth:`rlcore.interfaces.BaseLogger.check`), with the same bound; :func:`check_server` and
:func:`check_folder` are the two checks loggers need (a server that answers, a folder that can
be written).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rlcore.errors import ConfigError

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_KEY",
    "BoundedCall",
    "check_folder",
    "check_server",
    "env_or_option",
]

TIMEOUT_KEY = "trainer.logger_timeout_s"
# Its default: creating a local MLflow store took 20 s here on 2 loaded cores.
DEFAULT_TIMEOUT_S = 60.0


class BoundedCall:
    """``fn()`` started on a daemon thread; :meth:`wait` waits for it at most a bound.

    A call still running after the bound is left to finish (or not) on its own thread: Python
    cannot stop a thread, and a daemon one does not keep the process alive at exit.
    """

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as err:  # handed to the waiting thread by result()
            self._error = err

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def wait(self, timeout_s: float) -> bool:
        """Whether the call finished within ``timeout_s``."""
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def result(self) -> Any:
        """The call's value, or its exception raised here (only once it finished)."""
        if self._error is not None:
            raise self._error
        return self._value


def check_folder(path: Path, key: str) -> None:
    """One line naming ``key`` unless ``path`` is (or can be made) a folder this user writes."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        why = err.strerror or err
        msg = f"{key}: cannot write to {path} ({why}); make it writable or change {key}"
        raise ConfigError(msg) from None


def _http_status(url: str, timeout_s: float) -> int:
    """The status of ``GET <url path>`` (any answer will do: the server is there)."""
    import http.client
    import ssl

    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    conn: http.client.HTTPConnection
    if https:
        context = ssl.create_default_context()
        conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", parts.path or "/", headers={"Connection": "close"})
        return conn.getresponse().status
    finally:
        conn.close()


def check_server(url: str, key: str, timeout_s: float, *, fix: str) -> None:
    """One line naming ``key`` unless an HTTP(S) server at ``url`` answers within ``timeout_s``
    (name resolution, connect, TLS and the first answer together); ``fix`` ends the line."""
    import http.client

    where = f"{key} = {url!r}"
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        msg = f"{where}: not an http(s) URL with a host; {fix}"
        raise ConfigError(msg)
    call = BoundedCall(lambda: _http_status(url, timeout_s), "rlcore-check-server")
    if not call.wait(timeout_s + 0.5):  # the socket's own timeout normally ends it first
        cause = f"no answer within {timeout_s:g} s ({TIMEOUT_KEY})"
    else:
        try:
            call.result()
            return
        except ConnectionRefusedError:
            cause = "connection refused: nothing listens there"
        except TimeoutError:
            cause = f"no answer within {timeout_s:g} s ({TIMEOUT_KEY})"
        except socket.gaierror as err:
            cause = f"the host does not resolve ({err.strerror or err})"
        except (OSError, http.client.HTTPException) as err:
            cause = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    msg = f"{where}: {cause}; {fix} (checked before Ray starts)"
    raise ConfigError(msg)


def env_or_option(option: str | None, variable: str, key: str) -> tuple[str | None, str]:
    """``(value, where it came from)``: a logger option, else its environment variable."""
    if option:
        return option, key
    value = os.environ.get(variable, "").strip()
    return (value or None), variable
