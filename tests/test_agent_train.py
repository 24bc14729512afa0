"""``rlcore train`` with ``[agent]``: the policy worker runs the agent loop, metrics arrive."""

from __future__ import annotations

import json
import sys

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


@pytest.mark.parametrize("family", ["llama31", "glm45"])
def test_agent_training_is_token_exact_with_other_tool_formats(ray_session, tmp_path, family):
    """Llama 3.1 JSON calls and GLM-4.5 XML calls, each on its own chat template: the tools in
    the prompt and every tool turn from the template (agent/template_mismatches 0), the calls
    parsed and run, the reward's extras in the metrics, two GRPO steps trained."""
    import _agent_scripted
    from _chat_templates import FAMILIES

    from rlcore.config import load_config_text
    from rlcore.plugins import PluginRegistry
    from rlcore.testing.runs import arithmetic_rows, tiny_run_toml, write_jsonl
    from rlcore.testing.tiny_model import build_tiny_model
    from rlcore.trainer import run_training

    fam = FAMILIES[family]
    model = build_tiny_model(
        tmp_path / "model", hidden=64, layers=1, heads=2, kv_heads=1, **fam.model_kwargs()
    )
    train = write_jsonl(arithmetic_rows([(2, 2), (3, 4), (6, 1), (5, 5)]), tmp_path / "t.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        rewards=("gsm8k_tool",),
        extra=f'[agent]\ntools = ["calculator"]\ntool_parser = "{fam.parser}"\nmax_turns = 2\n',
    )
    text = text.replace("max_prompt_length = 64", "max_prompt_length = 1024")
    text = text.replace("max_response_length = 8", "max_response_length = 256")
    text = text.replace('name = "hf"', f'name = "scripted_turns"\nfamily = "{family}"')
    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    registry.register(_agent_scripted, name="scripted-turns")
    config = load_config_text(text, source=f"{family}.toml", registry=registry)
    assert config.agent is not None
    assert config.agent.turns() == "chat_template"
    # The workers cannot import the tests' helper modules: the classes travel by value.
    from ray import cloudpickle

    modules = (_agent_scripted, sys.modules["_chat_templates"])
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        assert run_training(config, registry=registry) == 0
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/tool_calls" in r]
    assert len(steps) == 2
    for row in steps:
        assert row["agent/tool_calls"] == 1.0  # one call per conversation, parsed and run
        assert row["agent/tool_errors"] == 0.0
        assert row["agent/template_mismatches"] == 0.0  # token-exact with the template
        assert row["reward/arithmetic/used_tool"] == 1.0  # a reward extra other than acc
        assert row["reward/arithmetic/acc"] == 0.5  # every other call is a-b: wrong
        assert row["actor/grad_norm"] > 0.0
