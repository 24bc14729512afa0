"""The kinds of component a plugin provides: their hooks, interface classes and where the
first-party ones are installed from."""

from __future__ import annotations

import logging
from typing import Final

from rlcore.interfaces import (
    BaseAlgorithm,
    BaseBatchReward,
    BaseEngine,
    BaseEnvironment,
    BaseHarness,
    BaseLogger,
    BaseReward,
    BaseRollout,
    BaseTool,
)

log = logging.getLogger(__name__)


ENTRY_POINT_GROUP: Final = "rlcore"
DISABLED_KEY: Final = "[plugins] disabled"

KINDS: Final = (
    "engine",
    "rollout",
    "reward",
    "algorithm",
    "tool",
    "harness",
    "environment",
    "logger",
    "policy_loss",
    "adv_estimator",
)
# Kinds whose targets are functions ("module:function"), resolved by resolve_function; the
# others are classes with a Config, resolved by resolve.
FUNCTION_KINDS: Final = ("policy_loss", "adv_estimator")
_HOOKS: Final = {
    "engine": "register_engines",
    "rollout": "register_rollouts",
    "reward": "register_rewards",
    "algorithm": "register_algorithms",
    "tool": "register_tools",
    "harness": "register_harnesses",
    "environment": "register_environments",
    "logger": "register_loggers",
    "policy_loss": "register_policy_losses",
    "adv_estimator": "register_adv_estimators",
}
# The interface class of each kind (the conformance checks read it too).
BASES: Final[dict[str, type]] = {
    "engine": BaseEngine,
    "rollout": BaseRollout,
    "reward": BaseReward,
    "algorithm": BaseAlgorithm,
    "tool": BaseTool,
    "harness": BaseHarness,
    "environment": BaseEnvironment,
    "logger": BaseLogger,
}
# Every interface a kind's class may subclass: a reward is per-sample (BaseReward) or batched
# (BaseBatchReward), one kind and one name space, so [reward] mixes them by name.
ACCEPTED_BASES: Final[dict[str, tuple[type, ...]]] = {
    kind: (base, BaseBatchReward) if kind == "reward" else (base,) for kind, base in BASES.items()
}

# Where the first-party components live, for "not installed" messages only: the core never
# branches on a plugin name for behaviour. Each is the distribution ``rlcore-<name>``.
INSTALL_HINTS: Final[dict[tuple[str, str], str]] = {
    (kind, name): f"rlcore-{name}"
    for kind, names in {
        "engine": ("fsdp2", "megatron"),
        "rollout": ("hf", "vllm", "sglang"),
        "reward": ("gsm8k", "math", "code"),
        "algorithm": ("ppo", "grpo", "rloo", "dapo", "remax", "distill"),
        "tool": ("calculator",),
        "logger": ("wandb", "mlflow"),
    }.items()
    for name in names
}
