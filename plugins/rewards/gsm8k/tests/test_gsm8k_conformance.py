"""The gsm8k reward against rlcore's reward and plugin-module conformance checks."""

from __future__ import annotations

from rlcore.testing.conformance import check_plugin_module, check_reward
from rlcore_gsm8k.reward import GSM8KReward


def test_gsm8k_plugin_module():
    assert check_plugin_module("rlcore_gsm8k.plugin") == {
        "reward/gsm8k": "rlcore_gsm8k.reward:GSM8KReward"
    }


def test_gsm8k_reward_conformance():
    cases = [("so 3 + 4 = 7\n#### 7", "7", 1.0), ("#### 8", "7", 0.0), ("no answer", "7", 0.0)]
    check_reward(GSM8KReward, cases=cases)
    flexible = GSM8KReward.Config(method="flexible", format_score=0.1)
    check_reward(
        GSM8KReward, flexible, cases=[("she makes $1,800 in total", "1800", 1.0), ("9", "7", 0.1)]
    )
