"""Registers the ``note_engine`` engine; declares the current contract (it followed the note)."""

from rlcore.hookspecs import hookimpl

contract_version = 2


@hookimpl
def register_engines():
    return {"note_engine": "rlcore_note_engine.engine:NoteEngine"}
