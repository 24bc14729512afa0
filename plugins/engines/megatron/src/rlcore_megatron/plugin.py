"""Registers the ``megatron`` engine; imports nothing heavy (discovery stays fast)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_engines() -> dict[str, str]:
    return {"megatron": "rlcore_megatron.engine:MegatronEngine"}
