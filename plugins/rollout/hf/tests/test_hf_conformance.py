"""HFRollout against rlcore's rollout and plugin-module conformance checks."""

from __future__ import annotations

import torch

from rlcore.testing.conformance import check_plugin_module, check_rollout
from rlcore.testing.tiny_model import build_tiny_model
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)


def test_hf_plugin_module():
    assert check_plugin_module("rlcore_hf.plugin") == {"rollout/hf": "rlcore_hf.rollout:HFRollout"}


def test_hf_rollout_conformance(tmp_path):
    path = build_tiny_model(tmp_path / "model", hidden=64, layers=1, heads=2, kv_heads=1)
    check_rollout(HFRollout, model_path=str(path))
    check_rollout(HFRollout, HFRollout.Config(max_batch_size=1), model_path=str(path), seed=3)
