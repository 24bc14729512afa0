"""Registers the ``torch`` engine; imports nothing heavy (discovery stays fast)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl


@hookimpl
def register_engines() -> dict[str, str]:
    return {"torch": "rlcore_torch_engine.engine:TorchEngine"}
