"""Fixtures of the HF rollout tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_hf_path(tmp_path_factory) -> str:
    """A tiny Qwen2 folder (rlcore.testing.tiny_model): 64 hidden, 2 heads, 1 KV head."""
    from rlcore.testing.tiny_model import build_tiny_model

    folder = tmp_path_factory.mktemp("hf_rollout") / "model"
    return str(build_tiny_model(folder, hidden=64, heads=2, kv_heads=1))
