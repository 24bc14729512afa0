"""Registers the ``old_engine`` engine. Written for contract 1: no ``contract_version``."""

from rlcore.hookspecs import hookimpl


@hookimpl
def register_engines():
    return {"old_engine": "rlcore_old_engine.engine:OldEngine"}
