"""A plugin module with a misspelled hook (singular ``register_engine``)."""

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_engine():
    return {"fake_typo": "rlcore_fake.components:FakeEngine"}
