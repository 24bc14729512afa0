"""Worker-side rules that need no Ray: one declaration per mesh, timeout settings."""

from __future__ import annotations

import pytest

from rlcore.dispatch import DispatchError
from rlcore.errors import ConfigError
from rlcore.protocol import DataProtoConfig
from rlcore.workers import Worker
from rlcore.workers.waiting import seconds_setting
from rlcore.workers.worker import WorkerSettings


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


def test_timeout_arguments_follow_the_config_rule():
    assert seconds_setting("call_timeout_s", 12) == 12.0
    for bad in (0, -1, float("inf"), float("nan"), "12", True, 1e300):
        with pytest.raises(ConfigError) as info:
            seconds_setting("call_timeout_s", bad)
        assert str(info.value).startswith(
            "call_timeout_s must be a finite number > 0 and <= 9223372036 s (a thread's wait), "
        )


def test_worker_settings_are_applied_by_the_worker(worker):
    from rlcore import plugins

    assert worker._collective_timeout_s == 600.0  # the default until the spec says otherwise
    try:
        worker.apply_settings(
            WorkerSettings(collective_timeout_s=7.5, auto_padding=True, disabled_plugins=("x",))
        )
        assert worker._collective_timeout_s == 7.5
        assert DataProtoConfig.auto_padding is True
        assert plugins.registry._process_disabled == ("x",)
    finally:
        worker.apply_settings(WorkerSettings())
    assert DataProtoConfig.auto_padding is False
    assert plugins.registry._process_disabled == ()
