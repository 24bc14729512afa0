"""The torch.distributed rendezvous store, listening on the group's master address only.

``init_process_group(init_method="tcp://addr:port")`` starts a ``TCPStore`` server on rank 0
that listens on every interface whatever ``addr`` says. Here rank 0 binds the listening socket
itself to ``MASTER_ADDR`` (127.0.0.1 for a local run, the node's IP in a cluster) and hands it
to the store (``master_listen_fd``, which the libuv store takes over); the other ranks connect
as before.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

__all__ = ["rendezvous_store"]


def rendezvous_store(
    master_addr: str, master_port: int, *, rank: int, world_size: int, timeout_s: float
) -> Any:
    """A ``TCPStore`` for ``dist.init_process_group(store=...)``; rank 0 serves it."""
    from torch._C._distributed_c10d import TCPStore  # torch.distributed re-exports it untyped

    timeout = timedelta(seconds=timeout_s)
    if rank != 0:
        return TCPStore(master_addr, master_port, world_size, False, timeout)
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((master_addr, master_port))
        sock.listen(max(128, world_size))
    except OSError:
        sock.close()
        raise
    # detach(): the store owns the descriptor from here on and closes it when it is destroyed.
    fd = sock.detach()
    return TCPStore(
        master_addr,
        master_port,
        world_size,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=True,
    )
