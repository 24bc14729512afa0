"""PPO against rlcore's algorithm and plugin-module conformance checks."""

from __future__ import annotations

import pytest

from rlcore.testing.conformance import check_algorithm, check_plugin_module
from rlcore_ppo.algorithm import PPO


def test_ppo_plugin_module():
    assert check_plugin_module("rlcore_ppo.plugin") == {"algorithm/ppo": "rlcore_ppo.algorithm:PPO"}


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"gamma": 0.9, "lam": 0.95, "value_loss_agg_mode": "seq-mean-token-mean"},
        {"use_kl_in_reward": True, "loss_agg_mode": "seq-mean-token-sum"},
    ],
)
def test_ppo_conformance(options):
    check_algorithm(PPO, PPO.Config(**options))
