"""Registers the ``vllm`` rollout; imports nothing heavy (discovery stays fast)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl


@hookimpl
def register_rollouts() -> dict[str, str]:
    return {"vllm": "rlcore_vllm.rollout:VLLMRollout"}
