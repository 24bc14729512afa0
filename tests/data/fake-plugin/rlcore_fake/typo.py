"""A plugin module with a misspelled hook (singular ``register_engine``)."""

from rlcore.hookspecs import hookimpl


@hookimpl
def register_engine():
    return {"fake_typo": "rlcore_fake.components:FakeEngine"}
