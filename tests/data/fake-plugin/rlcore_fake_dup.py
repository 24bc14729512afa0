"""Plugin module of rlcore-fake-dup: registers a reward name rlcore-fake also provides."""

from rlcore.hookspecs import hookimpl


@hookimpl
def register_rewards():
    return {"fake_dup": "rlcore_fake.components:FakeReward"}
