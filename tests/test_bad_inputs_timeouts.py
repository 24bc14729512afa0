"""Bad-input catalogue: every timeout key at 0, negative, ``inf``, ``nan``, not a number and
past what the code that waits on it can hold, given in the config (an override) and, for
``[resources]``, through its ``RLCORE_*`` variable. Each is one exact line, exit 2, before
anything starts: a wait must have a finite, positive bound that its consumer can hold
(``RLCORE_COLLECTIVE_TIMEOUT_S=inf`` once passed validation and failed inside a worker;
``1e15`` later did the same as an OverflowError, and ``reward.timeout_s = 1e300`` made every
reward call raise, the run training on zero rewards)."""

from __future__ import annotations

import _bad_inputs as bi
import pytest

from rlcore.cli import ENV_KEYS

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures

# [resources]: one rule for every bound of a wait (rlcore.interfaces.seconds).
RESOURCES = [key for key in ENV_KEYS.values() if key.endswith("_timeout_s")]
# Other time limits: the config key, and the overrides that select the section's plugin.
OTHERS = [
    ("reward.timeout_s", []),
    ("reward.batch_timeout_s", []),
    ("agent.tool_timeout_s", []),
    ("agent.generation_timeout_s", []),
    ("reward.options.math.timeout_s", []),
    ("rollout.request_timeout_s", ['rollout.name="vllm"']),
    ("trainer.logger_timeout_s", []),
]


THREAD = "9223372036 s (a thread's wait)"  # threading.TIMEOUT_MAX
POLL = "2147483 s"  # poll()/epoll_wait() take a C int of milliseconds
# The most each key holds, and which consumer sets it (shown in the error and docs/config.md).
MAXIMUM = {
    "resources.call_timeout_s": THREAD,
    "resources.start_timeout_s": THREAD,
    "resources.placement_timeout_s": THREAD,
    "resources.collective_timeout_s": f"{POLL} (torch.distributed's clocks, a C int of ms)",
    "resources.heartbeat_timeout_s": THREAD,
    "reward.timeout_s": "1431655 s (the scoring pool polls 1.5 x this, a C int of ms)",
    "reward.batch_timeout_s": "9223372036 s (a thread's join)",
    "agent.tool_timeout_s": f"{POLL} (the tool's pipe is polled, a C int of ms)",
    "agent.generation_timeout_s": "9223372036 s (asyncio.wait_for)",
    "reward.options.math.timeout_s": "9223372036 s (setitimer or a thread's join)",
    "rollout.request_timeout_s": "9223372036 s (a future's result)",
    "trainer.logger_timeout_s": f"{POLL} (a socket's poll, a C int of ms)",
}


def _expected(value: str, key: str) -> str:
    number = {"0": "0.0", "-1": "-1.0", "-0.5": "-0.5", "1e300": "1e+300", "1e15": "1e+15"}
    if value in number:
        shown = number[value] if value != "1e15" else "1000000000000000.0"
        return f"must be a finite number > 0 and <= {MAXIMUM[key]}, got {shown}"
    if value in ("inf", "-inf", "nan", "1e400"):
        return f"expected a finite number, got {'inf' if value == '1e400' else value}"
    return f'expected a number, got "{value}"'


VALUES = ["0", "-1", "-0.5", "inf", "-inf", "nan", "1e400", "1e300", "1e15", "abc", "30s"]


def test_every_time_limit_is_in_the_catalogue():
    assert set(MAXIMUM) == {*RESOURCES, *(key for key, _ in OTHERS)}


def test_every_resources_timeout_has_a_variable():
    assert RESOURCES == [
        "resources.call_timeout_s",
        "resources.start_timeout_s",
        "resources.placement_timeout_s",
        "resources.collective_timeout_s",
        "resources.heartbeat_timeout_s",
    ]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("key", RESOURCES)
def test_resources_timeout_in_the_config(run, capsys, registry, key, value):
    shown = f'"{value}"' if value in ("abc", "30s") else value
    code, err = bi.cli(["config", "validate", str(run), f"{key}={shown}"], capsys, registry)
    bi.assert_one_line(code, err, f"{run}: {key}: {_expected(value, key)}")


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("variable", [v for v, k in ENV_KEYS.items() if k in RESOURCES])
def test_resources_timeout_through_its_variable(
    run, capsys, registry, monkeypatch, variable, value
):
    monkeypatch.setenv(variable, value)
    key = ENV_KEYS[variable]
    code, err = bi.cli(["config", "validate", str(run)], capsys, registry)
    message = _expected(value, key)
    bi.assert_one_line(code, err, f"{run}: {key}: {message} (set by {variable}={value!r})")


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(("key", "select"), OTHERS, ids=[k for k, _ in OTHERS])
def test_other_time_limits(run, capsys, registry, key, select, value):
    shown = f'"{value}"' if value in ("abc", "30s") else value
    argv = ["config", "validate", str(run), *select, f"{key}={shown}"]
    code, err = bi.cli(argv, capsys, registry)
    bi.assert_one_line(code, err, f"{run}: {key}: {_expected(value, key)}")


@pytest.mark.parametrize(("key", "select"), [(k, []) for k in RESOURCES] + OTHERS)
def test_the_maximum_itself_is_accepted(run, capsys, registry, key, select):
    most = MAXIMUM[key].split()[0]
    argv = ["config", "validate", str(run), *select, f"{key}={most}"]
    assert bi.cli(argv, capsys, registry)[0] == 0
