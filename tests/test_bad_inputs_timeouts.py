"""Bad-input catalogue: every timeout key at 0, negative, ``inf``, ``nan`` and not a number,
given in the config (an override) and, for ``[resources]``, through its ``RLCORE_*`` variable.
Each is one exact line, exit 2, before anything starts: a wait must have a finite, positive
bound (issue 31, item 9: ``RLCORE_COLLECTIVE_TIMEOUT_S=inf`` once passed validation and failed
inside a worker)."""

from __future__ import annotations

import _bad_inputs as bi
import pytest

from rlcore.cli import ENV_KEYS

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures

# [resources]: one rule for every bound of a wait (rlcore.config.schema.check_seconds).
RESOURCES = [key for key in ENV_KEYS.values() if key.endswith("_timeout_s")]
# Other time limits: the config key, and the overrides that select the section's plugin.
OTHERS = [
    ("reward.timeout_s", []),
    ("reward.batch_timeout_s", []),
    ("agent.tool_timeout_s", []),
    ("agent.generation_timeout_s", []),
    ("reward.options.math.timeout_s", []),
    ("rollout.request_timeout_s", ['rollout.name="vllm"']),
]


def _expected(value: str, *, finite_rule: bool) -> str:
    number = {"0": "0.0", "-1": "-1.0", "-0.5": "-0.5"}
    if value in number:
        bound = "a finite number > 0" if finite_rule else "> 0.0"
        return f"must be {bound}, got {number[value]}"
    if value in ("inf", "-inf", "nan", "1e400"):
        return f"expected a finite number, got {'inf' if value == '1e400' else value}"
    return f'expected a number, got "{value}"'


VALUES = ["0", "-1", "-0.5", "inf", "-inf", "nan", "1e400", "abc", "30s"]


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
    bi.assert_one_line(code, err, f"{run}: {key}: {_expected(value, finite_rule=True)}")


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("variable", [v for v, k in ENV_KEYS.items() if k in RESOURCES])
def test_resources_timeout_through_its_variable(
    run, capsys, registry, monkeypatch, variable, value
):
    monkeypatch.setenv(variable, value)
    key = ENV_KEYS[variable]
    code, err = bi.cli(["config", "validate", str(run)], capsys, registry)
    message = _expected(value, finite_rule=True)
    bi.assert_one_line(code, err, f"{run}: {key}: {message} (set by {variable}={value!r})")


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(("key", "select"), OTHERS, ids=[k for k, _ in OTHERS])
def test_other_time_limits(run, capsys, registry, key, select, value):
    shown = f'"{value}"' if value in ("abc", "30s") else value
    argv = ["config", "validate", str(run), *select, f"{key}={shown}"]
    code, err = bi.cli(argv, capsys, registry)
    bi.assert_one_line(code, err, f"{run}: {key}: {_expected(value, finite_rule=False)}")
