"""``[agent.options.NAME]``: a tool's ``Config`` set in the TOML reaches the tool the workers
build; a wrong key or options for a tool not selected are one line naming the key."""

from __future__ import annotations

import pytest

from rlcore.config import ConfigValidationError, load_config_text
from rlcore.testing.runs import tiny_run_toml


def _text(tmp_path, agent: str) -> str:
    return tiny_run_toml(
        model=tmp_path,
        train_files=[tmp_path / "t.jsonl"],
        run_dir=tmp_path / "run",
        extra=agent,
    )


def test_a_tool_option_in_the_toml_reaches_the_tool(tmp_path):
    from rlcore.roles.policy import _build_agent_loop
    from rlcore.trainer.specs import _agent_spec
    from rlcore_calculator.tool import CalculatorTool

    text = _text(
        tmp_path,
        '[agent]\ntools = ["calculator"]\n[agent.options.calculator]\nname = "calc"\n',
    )
    config = load_config_text(text, source="agent.toml")
    assert config.agent is not None
    assert config.agent.options == {"calculator": CalculatorTool.Config(name="calc")}
    spec = _agent_spec(config, None)
    assert spec is not None
    tool = spec.tools[0].build()
    assert isinstance(tool, CalculatorTool)
    assert tool.schema()["name"] == "calc"
    # What the worker builds: the loop finds the tool by its configured name.
    import attrs

    from rlcore.testing.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", hidden=64, layers=1, heads=2)
    loop = _build_agent_loop(attrs.evolve(spec, tokenizer_path=str(model)))
    assert set(loop.tools) == {"calc"}


def test_defaults_when_no_options_table(tmp_path):
    from rlcore_calculator.tool import CalculatorTool

    config = load_config_text(_text(tmp_path, '[agent]\ntools = ["calculator"]\n'), source="a")
    assert config.agent is not None
    assert config.agent.options == {"calculator": CalculatorTool.Config()}


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        (
            '[agent]\ntools = ["calculator"]\n[agent.options.calculator]\nnmae = "x"\n',
            "agent.options.calculator.nmae",
        ),
        (
            '[agent]\ntools = ["calculator"]\n[agent.options.search]\nk = 1\n',
            "agent.options.search: options for tool 'search', which [agent] tools does not",
        ),
    ],
    ids=["unknown-key", "not-selected"],
)
def test_bad_tool_options_are_one_line_naming_the_key(tmp_path, agent, expected):
    with pytest.raises(ConfigValidationError) as info:
        load_config_text(_text(tmp_path, agent), source="agent.toml")
    message = str(info.value)
    assert expected in message, message
