"""Plugin module of rlcore-fake-dup: registers a reward name rlcore-fake also provides."""

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_rewards():
    return {"fake_dup": "rlcore_fake.components:FakeReward"}
