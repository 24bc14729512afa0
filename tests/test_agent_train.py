"""``rlcore train`` with ``[agent]``: the policy worker runs the agent loop, metrics arrive."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_two_agent_steps_on_the_tiny_model(ray_session, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    train = write_jsonl(arithmetic_rows([(1, 2), (3, 4)] * 2), tmp_path / "train.jsonl")
    val = write_jsonl(arithmetic_rows([(5, 6)], "test"), tmp_path / "val.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        val_files=[val],
        test_freq=2,
        run_dir=tmp_path / "run",
        extra='[agent]\ntools = ["calculator"]\nmax_turns = 2\n',
    )
    config = load_config_text(text, source="agent.toml")
    assert config.agent is not None
    assert config.agent.tools == ("calculator",)
    assert run_training(config) == 0
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 1, 2]  # validation before training, 2 steps
    for key in ("agent/turns", "agent/tool_calls", "agent/tool_errors", "agent/truncated"):
        assert key in rows[-1], key
        assert f"val/{key}" in rows[0], key  # validation runs the agent loop too
    assert rows[-1]["agent/turns"] >= 1.0


def test_an_unknown_tool_is_one_line_naming_the_key(tmp_path):
    from rlcore.config import ConfigValidationError, load_config_text
    from rlcore.testing.runs import tiny_run_toml

    text = tiny_run_toml(
        model=tmp_path,
        train_files=[tmp_path / "t.jsonl"],
        run_dir=tmp_path / "run",
        extra='[agent]\ntools = ["calculater"]\n',
    )
    with pytest.raises(ConfigValidationError) as info:
        load_config_text(text, source="agent.toml")
    message = str(info.value)
    assert "agent.tools[0]" in message or "agent.tools.0" in message, message
    assert "unknown tool 'calculater'" in message
    assert "Did you mean 'calculator'?" in message
