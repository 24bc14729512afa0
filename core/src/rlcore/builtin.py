"""The core's own components, registered through the plugin hooks like any third-party one:
the loggers, the policy losses and the advantage estimators (verl's names).

Imports nothing heavy, and nothing of the modules it names: targets are ``module:attr``
strings, resolved on first use, so :mod:`rlcore.plugins` registers this module without
importing ``rlcore.rl`` or ``rlcore.tracking`` (which themselves import the registry).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlcore.hookspecs import hookimpl

contract_version = 2

_LOSSES = "rlcore.rl.losses"
_ADVANTAGES = "rlcore.rl.advantages"


def _targets(module: str, pattern: str, names: tuple[str, ...]) -> dict[str, str]:
    """``{name: "module:<pattern with the name>"}``: each function is named after its name."""
    return {name: f"{module}:{pattern.format(name)}" for name in names}


@hookimpl
def register_loggers() -> Mapping[str, str]:
    return {
        "console": "rlcore.tracking.loggers:ConsoleLogger",
        "jsonl": "rlcore.tracking.loggers:JsonlLogger",
        "tensorboard": "rlcore.tracking.loggers:TensorBoardLogger",
    }


@hookimpl
def register_policy_losses() -> Mapping[str, str]:
    names = ("vanilla", "gspo", "cispo", "gpg", "sapo", "gmpo", "kl_cov")
    return _targets(_LOSSES, "compute_policy_loss_{}", names)


@hookimpl
def register_adv_estimators() -> Mapping[str, str]:
    names = ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
    return _targets(_ADVANTAGES, "{}_estimator", names)
