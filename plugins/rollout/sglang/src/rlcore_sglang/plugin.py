"""Registers the ``sglang`` rollout; imports nothing heavy (discovery stays fast)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_rollouts() -> dict[str, str]:
    return {"sglang": "rlcore_sglang.rollout:SGLangRollout"}
