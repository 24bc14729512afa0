"""Registers the ``mlflow`` logger. Imports nothing heavy (mlflow loads when a run selects it)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

contract_version = 2


@hookimpl
def register_loggers() -> dict[str, str]:
    return {"mlflow": "rlcore_mlflow.logger:MlflowLogger"}
