"""Ray start-up options: loopback binding and a fast, one-line failure for a dead address."""

from __future__ import annotations

import socket
import time

import pytest

from rlcore.config.schema import ResourcesConfig
from rlcore.errors import ResourceError
from rlcore.workers.cluster import check_reachable, ray_init_kwargs


def test_joining_a_loopback_cluster_keeps_the_driver_on_loopback():
    kwargs = ray_init_kwargs(ResourcesConfig(), environ={"RAY_ADDRESS": "127.0.0.1:6379"})
    assert kwargs == {"address": "127.0.0.1:6379", "_node_ip_address": "127.0.0.1"}
    remote = ray_init_kwargs(ResourcesConfig(), environ={"RAY_ADDRESS": "10.1.2.3:6379"})
    assert remote == {"address": "10.1.2.3:6379"}  # bound as that cluster was started


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_address_fails_within_its_bound():
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(ResourceError) as info:
        check_reachable(f"127.0.0.1:{port}", timeout_s=1.5, key="RAY_ADDRESS")
    assert time.monotonic() - start < 5
    assert str(info.value) == (
        f"RAY_ADDRESS = 127.0.0.1:{port}: no Ray cluster answers there (Connection refused, "
        "tried for 2 s); start one with `ray start --head`, fix the address, or unset it for a "
        "private local Ray"
    )


def test_auto_and_client_addresses_are_not_probed():
    # A listening port must answer as Ray's GCS: test_cluster_join.py.
    check_reachable("auto", key="RAY_ADDRESS")
    check_reachable("ray://10.0.0.1:10001", key="RAY_ADDRESS")
