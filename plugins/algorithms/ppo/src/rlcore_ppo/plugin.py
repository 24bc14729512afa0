"""Registers the ``ppo`` algorithm. Imports nothing heavy: the class is named, not imported."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_algorithms() -> dict[str, str]:
    return {"ppo": "rlcore_ppo.algorithm:PPO"}
