from __future__ import annotations

from rlcore.hookspecs import hookimpl


@hookimpl
def register_rewards() -> dict[str, str]:
    return {"exit_reward": "rlcore_exit_reward.reward:ExitReward"}
