"""Servers that misbehave, for the tests of anything that talks to one (a tracker, a client):
one that accepts connections and never answers, and a port where nothing listens.

    with silent_server() as url:            # "http://127.0.0.1:PORT"
        ...                                 # every connection is accepted, no byte comes back
    url = closed_port_url()                 # connection refused
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["closed_port_url", "silent_server"]

_LOOPBACK = "127.0.0.1"


@contextmanager
def silent_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a loopback server that accepts every connection, reads
    nothing and never answers, until the block ends."""
    listener = socket.create_server((_LOOPBACK, 0))
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed
                return
            held.append(conn)  # kept open: the client waits for an answer that never comes

    thread = threading.Thread(target=accept, name="rlcore-silent-server", daemon=True)
    thread.start()
    try:
        yield f"http://{_LOOPBACK}:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in held:
            conn.close()


def closed_port_url() -> str:
    """``http://127.0.0.1:PORT`` of a loopback port nothing listens on (it was just freed)."""
    with socket.create_server((_LOOPBACK, 0)) as sock:
        port = sock.getsockname()[1]
    return f"http://{_LOOPBACK}:{port}"
