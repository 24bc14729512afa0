"""Registers the ``wandb`` logger. Imports nothing heavy (wandb loads when a run selects it)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

contract_version = 2


@hookimpl
def register_loggers() -> dict[str, str]:
    return {"wandb": "rlcore_wandb.logger:WandbLogger"}
