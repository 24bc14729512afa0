"""The core's own loggers, registered through the plugin hooks like any third-party one."""

from __future__ import annotations

from collections.abc import Mapping

from rlcore.hookspecs import hookimpl

contract_version = 2


@hookimpl
def register_loggers() -> Mapping[str, str]:
    return {
        "console": "rlcore.tracking.loggers:ConsoleLogger",
        "jsonl": "rlcore.tracking.loggers:JsonlLogger",
        "tensorboard": "rlcore.tracking.loggers:TensorBoardLogger",
    }
