"""A well-behaved plugin module: returns data, imports nothing heavy."""

from rlcore.hookspecs import hookimpl

# The plugin contract this module is written for (rlcore.interfaces.CONTRACT_VERSION).
contract_version = 2


@hookimpl
def register_engines():
    return {"fake": "rlcore_fake.components:FakeEngine"}


@hookimpl
def register_rollouts():
    return {
        "fake": "rlcore_fake.components:FakeRollout",
        # Its module imports a package that is not installed: fails only when selected.
        "fake_missing": "rlcore_fake.needs_missing:MissingRollout",
        # Resolves to a class that is not a BaseRollout.
        "fake_notsub": "rlcore_fake.components:NotARollout",
    }


@hookimpl
def register_rewards():
    return {
        "fake": "rlcore_fake.components:FakeReward",
        "fake_exact": "rlcore_fake.components:FakeExactReward",
        # rlcore-fake-dup registers this name too.
        "fake_dup": "rlcore_fake.components:FakeReward",
    }


@hookimpl
def register_algorithms():
    return {"fake": "rlcore_fake.components:FakeAlgorithm"}
