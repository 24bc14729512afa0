"""Fixtures shared by every test directory (core/tests, plugins/*/*/tests, tests/)."""

from __future__ import annotations

import os

import pytest

# One torch thread per process: measured here, unpinned threads under contention made
# generation 30x slower. Workers pin their own share; this covers the test process.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (it costs 4-6 s to start), dashboard off."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,  # logical slots; tests place at most a few 1-CPU actors on 2 real cores
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
            configure_logging=False,
        )
    return ray
    # Left running on purpose: later tests in the session reuse it; ray shuts down at exit.
