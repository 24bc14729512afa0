"""GRPO and REINFORCE++ against rlcore's algorithm and plugin-module conformance checks."""

from __future__ import annotations

import pytest

from rlcore.testing.conformance import check_algorithm, check_plugin_module
from rlcore_grpo.algorithm import GRPO, ReinforcePlusPlus


def test_grpo_plugin_module():
    assert check_plugin_module("rlcore_grpo.plugin") == {
        "algorithm/grpo": "rlcore_grpo.algorithm:GRPO",
        "algorithm/reinforce_plus_plus": "rlcore_grpo.algorithm:ReinforcePlusPlus",
        "algorithm/best_of_n": "rlcore_grpo.best_of_n:BestOfN",
    }


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_kl_loss": True, "entropy_coeff": 0.01},
        {"norm_adv_by_std": False, "loss_agg_mode": "seq-mean-token-sum-norm"},
        {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"},
    ],
)
def test_grpo_conformance(options):
    check_algorithm(GRPO, GRPO.Config(**options))


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_reinforce_plus_plus_conformance(estimator):
    check_algorithm(ReinforcePlusPlus, ReinforcePlusPlus.Config(adv_estimator=estimator, gamma=0.9))
