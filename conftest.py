"""Fixtures shared by every test directory (core/tests, plugins/*/*/tests, tests/)."""

from __future__ import annotations

import os

import pytest

# One torch thread per process: measured here, unpinned threads under contention made
# generation 30x slower. Workers pin their own share; this covers the test process.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (it costs 4-6 s to start), bound to loopback
    like a run's private Ray (``rlcore.workers.cluster``: its init arguments, and the switch
    that keeps Ray from replacing 127.0.0.1 with the host's address), dashboard off."""
    from rlcore.config.schema import ResourcesConfig
    from rlcore.workers.cluster import loopback_only, ray_init_kwargs

    # A run's arguments (address "local", no dashboard, node IP 127.0.0.1) with 4 logical
    # CPU slots: tests place at most a few 1-CPU actors on 2 real cores.
    kwargs = ray_init_kwargs(ResourcesConfig(), environ={}) | {"num_cpus": 4}
    loopback_only()  # before ray is imported, as start_ray does
    import ray

    if not ray.is_initialized():
        ray.init(**kwargs, log_to_driver=True, configure_logging=False)
    return ray
    # Left running on purpose: later tests in the session reuse it; ray shuts down at exit.
