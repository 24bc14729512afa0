"""Registers the policy loss ``custom_pg`` and the advantage estimator ``group_size`` by name;
imports nothing heavy (the functions are named, imported only when a config selects them)."""

from __future__ import annotations

from rlcore.hookspecs import hookimpl

contract_version = 2


@hookimpl
def register_policy_losses() -> dict[str, str]:
    return {"custom_pg": "rlcore_custom_rl.rl:compute_policy_loss_custom_pg"}


@hookimpl
def register_adv_estimators() -> dict[str, str]:
    return {"group_size": "rlcore_custom_rl.rl:compute_group_size_advantage"}
