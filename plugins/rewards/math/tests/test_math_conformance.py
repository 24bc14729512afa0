"""The math reward against rlcore's reward and plugin-module conformance checks."""

from __future__ import annotations

from rlcore.testing.conformance import check_plugin_module, check_reward
from rlcore_math.reward import MathReward


def test_math_plugin_module():
    assert check_plugin_module("rlcore_math.plugin") == {
        "reward/math": "rlcore_math.reward:MathReward"
    }


def test_math_reward_conformance():
    cases = [
        ("so $x = \\boxed{\\dfrac{1}{2}}$.", "\\frac12", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("no box", "4", 0.0),
    ]
    check_reward(MathReward, cases=cases)
    check_reward(MathReward, MathReward.Config(extract="both", use_math_verify=False))
