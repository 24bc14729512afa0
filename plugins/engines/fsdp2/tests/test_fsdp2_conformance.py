"""FSDP2Engine against rlcore's engine and plugin-module conformance checks (one process)."""

from __future__ import annotations

import torch

from rlcore.testing.conformance import check_engine, check_plugin_module
from rlcore.testing.tiny_model import build_tiny_model
from rlcore_fsdp2.engine import FSDP2Engine

torch.set_num_threads(1)


def test_fsdp2_plugin_module():
    assert check_plugin_module("rlcore_fsdp2.plugin") == {
        "engine/fsdp2": "rlcore_fsdp2.engine:FSDP2Engine"
    }


def test_fsdp2_engine_conformance(tmp_path):
    path = build_tiny_model(tmp_path / "model", hidden=64, layers=1, heads=2, kv_heads=1)
    check_engine(FSDP2Engine, model_path=str(path), critic=True)
    check_engine(FSDP2Engine, FSDP2Engine.Config(reshard_after_forward=False), model_path=str(path))
