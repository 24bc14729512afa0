"""The core's policy losses and advantage estimators, registered through the plugin hooks like
any third-party one (verl's names). Imports nothing heavy: targets are named, not imported."""

from __future__ import annotations

from collections.abc import Mapping

from rlcore.hookspecs import hookimpl

contract_version = 2

_LOSSES = "rlcore.rl.losses"
_ADVANTAGES = "rlcore.rl.advantages"


@hookimpl
def register_policy_losses() -> Mapping[str, str]:
    return {
        "vanilla": f"{_LOSSES}:compute_policy_loss_vanilla",
        "gspo": f"{_LOSSES}:compute_policy_loss_gspo",
        "cispo": f"{_LOSSES}:compute_policy_loss_cispo",
        "gpg": f"{_LOSSES}:compute_policy_loss_gpg",
        "sapo": f"{_LOSSES}:compute_policy_loss_sapo",
        "gmpo": f"{_LOSSES}:compute_policy_loss_gmpo",
        "kl_cov": f"{_LOSSES}:compute_policy_loss_kl_cov",
    }


@hookimpl
def register_adv_estimators() -> Mapping[str, str]:
    return {
        "gae": f"{_ADVANTAGES}:gae_estimator",
        "grpo": f"{_ADVANTAGES}:grpo_estimator",
        "rloo": f"{_ADVANTAGES}:rloo_estimator",
        "reinforce_plus_plus": f"{_ADVANTAGES}:reinforce_plus_plus_estimator",
        "reinforce_plus_plus_baseline": f"{_ADVANTAGES}:reinforce_plus_plus_baseline_estimator",
    }
