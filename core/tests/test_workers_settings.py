"""Worker-side rules that need no Ray: one declaration per mesh, timeout settings."""

from __future__ import annotations

import pytest

from rlcore.dispatch import DispatchError
from rlcore.errors import ConfigError
from rlcore.workers import Worker
from rlcore.workers.waiting import call_timeout_s, start_timeout_s, timeout_setting


@pytest.fixture
def worker(monkeypatch):
    # A rank-0 Worker picks a port when none is set: give it one so the test env stays as is.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    return Worker()


def test_set_dispatch_info_refuses_a_mesh_declared_twice(worker):
    worker.set_dispatch_info(dp_rank=0, dp_size=2)
    worker.set_dispatch_info(dp_rank=0, dp_size=1, mesh="rollout")  # another mesh is fine
    with pytest.raises(DispatchError, match="mesh 'default' is already declared on rank 0"):
        worker.set_dispatch_info(dp_rank=1, dp_size=2)
    with pytest.raises(ValueError, match="already declared"):  # verl raises ValueError
        worker.set_dispatch_info(dp_rank=0, dp_size=1, mesh="rollout")
    assert worker.rlcore_dispatch_info().dp_size == 2  # the first declaration stands


def test_timeout_settings(monkeypatch):
    monkeypatch.delenv("RLCORE_CALL_TIMEOUT_S", raising=False)
    monkeypatch.delenv("RLCORE_START_TIMEOUT_S", raising=False)
    assert call_timeout_s() == 3600.0
    assert start_timeout_s() == 600.0
    monkeypatch.setenv("RLCORE_CALL_TIMEOUT_S", " 12 ")
    assert call_timeout_s() == 12.0
    assert call_timeout_s(3.0) == 3.0  # a constructor argument wins
    for bad in ("0", "-1", "never", "nan"):
        monkeypatch.setenv("RLCORE_START_TIMEOUT_S", bad)
        with pytest.raises(ConfigError, match=f"RLCORE_START_TIMEOUT_S='{bad}'"):
            start_timeout_s()
    with pytest.raises(ConfigError, match="call_timeout_s=0"):
        timeout_setting("RLCORE_CALL_TIMEOUT_S", 1.0, given=0)
