"""The agent quickstart's assets: a tool conversation fits agent.toml's lengths and parses."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart"


def _load(name: str):
    sys.path.insert(0, str(QUICKSTART))  # prepare_agent.py imports its siblings
    try:
        spec = importlib.util.spec_from_file_location(f"agent_{name}", QUICKSTART / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(QUICKSTART))
    return module


def test_a_tool_conversation_fits_the_configured_lengths_and_its_call_parses():
    from rlcore.agent.parsers import HermesToolParser
    from rlcore_calculator.tool import CalculatorTool

    tokenizer = _load("make_model").build_tokenizer()
    prepare = _load("prepare_agent")
    config = tomllib.loads((QUICKSTART / "agent.toml").read_text())
    ids, mask = prepare._example(tokenizer, 99, 99, use_tool=True)
    n_prompt = mask.index(1)
    assert n_prompt <= config["data"]["max_prompt_length"]
    assert len(ids) - n_prompt <= config["data"]["max_response_length"]
    # The warm start teaches exactly the call the agent loop parses and the tool answers.
    first_turn = tokenizer.decode(ids[n_prompt : mask.index(0, n_prompt)])
    calls, errors = HermesToolParser().parse(first_turn)
    assert errors == []
    assert [c.name for c in calls] == config["agent"]["tools"]
    assert CalculatorTool().call(calls[0].arguments) == "198"


def test_the_agent_data_uses_the_quickstart_split(tmp_path):
    import pyarrow.parquet as pq

    prepare = _load("prepare")
    train_pairs, _dev, test_pairs = prepare.split_pairs()
    train, test = _load("prepare_agent").write_data(tmp_path)
    rows = pq.read_table(test).to_pylist()
    assert len(rows) == len(test_pairs)
    assert [r["reward_model"]["ground_truth"] for r in rows] == [str(a + b) for a, b in test_pairs]
    assert pq.read_metadata(train).num_rows == len(train_pairs)
