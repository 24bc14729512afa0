"""Joining a cluster is bounded whatever answers at ``RAY_ADDRESS``: a port that accepts TCP but
is not Ray (silent, or sending something else) is one line within the join timeout
(``resources.start_timeout_s``), where ``ray.init`` would wait forever; a real Ray GCS passes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from rlcore.errors import ResourceError
from rlcore.workers.cluster import check_reachable


@pytest.fixture
def server(request) -> Iterator[str]:
    """A TCP server on loopback that accepts every connection and then sends ``request.param``
    (nothing when empty) and keeps it open until the test ends."""
    reply: bytes = request.param
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)
            if reply:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


SILENT = b""
GARBAGE = b"HTTP/1.1 400 Bad Request\r\n\r\n"


@pytest.mark.parametrize("server", [SILENT], indirect=True, ids=["silent"])
def test_a_port_that_accepts_and_says_nothing_is_one_line(server):
    with pytest.raises(ResourceError) as info:
        check_reachable(server, timeout_s=1.5, key="RAY_ADDRESS")
    assert str(info.value) == (
        f"RAY_ADDRESS = {server}: something accepts connections there but did not answer as "
        "Ray's GCS (a gRPC server) within 1.5 s (resources.start_timeout_s = 1.5); fix the "
        "address to the head's GCS port (ray start --head prints it), or unset it for a "
        "private local Ray"
    )


@pytest.mark.parametrize("server", [GARBAGE], indirect=True, ids=["garbage"])
def test_a_port_that_answers_something_else_is_one_line(server):
    with pytest.raises(ResourceError) as info:
        check_reachable(server, timeout_s=60, key="resources.ray_address")
    assert str(info.value) == (
        f"resources.ray_address = {server}: something accepts connections there but answered "
        "b'HTTP/1.1 ', not as Ray's GCS (a gRPC server) (resources.start_timeout_s = 60); fix "
        "the address to the head's GCS port (ray start --head prints it), or unset it for a "
        "private local Ray"
    )


@pytest.mark.parametrize("server", [SILENT], indirect=True, ids=["silent"])
def test_rlcore_train_start_fails_in_one_line_before_ray_init(server, tmp_path):
    """The CLI's own path (``_start_ray`` over ``start_ray``) in a fresh process: the join
    timeout is ``resources.start_timeout_s``, and ``ray.init`` is never reached."""
    script = (
        "import types, sys\n"
        "from rlcore.cli import _start_ray\n"
        "from rlcore.config.schema import ResourcesConfig\n"
        "from rlcore.errors import RlcoreError\n"
        "from rlcore.workers import cluster\n"
        "config = types.SimpleNamespace(resources=ResourcesConfig(start_timeout_s=2.0))\n"
        "try:\n"
        "    _start_ray(cluster.start_ray, config)\n"
        "except RlcoreError as err:\n"
        "    import ray\n"
        "    print(f'error: {err}', file=sys.stderr)\n"
        "    sys.exit(2 if not ray.is_initialized() else 3)\n"
    )
    env = {**os.environ, "RAY_ADDRESS": server}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: RAY_ADDRESS = {server}: something accepts connections there but did not "
        "answer as Ray's GCS (a gRPC server) within 2 s (resources.start_timeout_s = 2); fix "
        "the address to the head's GCS port (ray start --head prints it), or unset it for a "
        "private local Ray"
    )


def test_a_real_ray_gcs_passes(ray_session):
    gcs = ray_session.get_runtime_context().gcs_address
    check_reachable(gcs, timeout_s=60, key="RAY_ADDRESS")
