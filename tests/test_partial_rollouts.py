"""``rollout.partial_rollouts`` (issue 45, item 4): the lines that refuse it before Ray, and
the per-token weight versions a row's version is derived from.

The mechanism itself (a sync mid-batch aborting and continuing vLLM requests) runs on CPU
vLLM in ``plugins/rollout/vllm/tests/test_vllm_async.py`` (``bash scripts/test_vllm.sh``).
"""

from __future__ import annotations

import pytest
import torch

PLACE_ROLLOUT = """placement = { rollout = "gen" }
[resources.pools.gen]
processes_per_node = 1
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, write_jsonl

    root = tmp_path_factory.mktemp("partial")
    model = tiny_run_model(root / "model")
    return model, write_jsonl(
        arithmetic_rows([(a, b) for a in range(2) for b in range(2)]), root / "train.jsonl"
    )


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        (
            "",
            "rollout.partial_rollouts: partial rollouts continue a batch across a weight sync, "
            'which only the asynchronous modes have; set trainer.async_mode = "one_step_off" '
            'or "fully_async"',
        ),
        (
            'async_mode = "fully_async"',
            "rollout.partial_rollouts: rollout 'hf' finishes its batch before a weight sync "
            "(only vLLM with [rollout] async_engine = true continues requests across one); set "
            "rollout.partial_rollouts = false",
        ),
        (
            'async_mode = "fully_async"  # agent',
            "rollout.partial_rollouts: an [agent] run's turns (generate_one) are not continued "
            "across a weight sync; set rollout.partial_rollouts = false",
        ),
    ],
    ids=["sync-run", "hf-rollout", "agent"],
)
def test_partial_rollouts_are_refused_in_one_line(tmp_path, assets, capsys, trainer, message):
    import _bad_inputs as bi

    from rlcore.plugins import PluginRegistry
    from rlcore.testing.runs import tiny_run_toml

    model, train = assets
    text = tiny_run_toml(
        model=model, train_files=[train], run_dir=tmp_path / "run", extra=PLACE_ROLLOUT
    ).replace("[trainer]\n", f"[trainer]\n{trainer}\n", 1)
    if "# agent" in trainer:
        text += '[agent]\ntools = ["calculator"]\n'
    config = tmp_path / "run.toml"
    config.write_text(text)
    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    overrides = ["rollout.partial_rollouts=true"]
    code, err = bi.train_preflight(config, overrides, capsys, registry)
    prefixed = not trainer or "# agent" in trainer  # the loader's lines name the file
    bi.assert_one_line(code, err, f"{config}: {message}" if prefixed else message)


def test_a_row_takes_its_oldest_tokens_version():
    from rlcore.protocol import DataProto
    from rlcore.roles.rollout_worker import TOKEN_WEIGHT_VERSIONS_KEY, sample_versions

    versions = torch.tensor([[3, 3, 4, 0], [4, 4, 0, 0], [0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    out = DataProto.from_dict(tensors={TOKEN_WEIGHT_VERSIONS_KEY: versions, "response_mask": mask})
    # The padding's 0 is no token; a row without tokens takes the call's version.
    assert sample_versions(out, 4).tolist() == [3, 4, 4]
    plain = DataProto.from_dict(tensors={"response_mask": mask})
    assert sample_versions(plain, 2).tolist() == [2, 2, 2]
