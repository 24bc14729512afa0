"""``check_environment`` (rlcore.testing.conformance): what it accepts and the rule each
broken environment is reported under."""

from __future__ import annotations

import pytest

from rlcore.interfaces import BaseEnvironment, HarnessTask
from rlcore.testing.conformance import check_environment

TASK = HarnessTask(messages=[{"role": "user", "content": "2 + 3?"}], ground_truth="5")


class Echo(BaseEnvironment):
    """Reward 1.0 when the action is the ground truth; ends on it or after two steps."""

    def reset(self, task):
        self.answer, self.steps = str(task.ground_truth), 0
        return "", {}

    def step(self, action):
        self.steps += 1
        hit = action.strip() == self.answer
        return "ok", float(hit), hit, self.steps >= 2, {}


class RaisesOnNonAscii(Echo):
    def step(self, action):
        action.encode("ascii")
        return super().step(action)


class FourTuple(Echo):
    def step(self, action):
        return super().step(action)[:4]


class NanReward(Echo):
    def step(self, action):
        return "ok", float("nan"), True, False, {}


class ResetReturnsText(Echo):
    def reset(self, task):
        super().reset(task)
        return "go"


def test_a_conforming_environment_and_its_cases_pass():
    check_environment(Echo, cases=[(TASK, ["4", "5"], 1.0), (TASK, ["5", "5"], 1.0)])


@pytest.mark.parametrize(
    ("cls", "cases", "rule"),
    [
        (RaisesOnNonAscii, [], "step must not raise: non-ASCII: UnicodeEncodeError"),
        (FourTuple, [], "step must return (observation, reward, terminated, truncated, info)"),
        (NanReward, [], "step's reward must be a finite number"),
        (ResetReturnsText, [], "reset must return (observation, info)"),
        (Echo, [(TASK, ["4", "4", "5"], 1.0)], "the author's case must score as expected"),
    ],
)
def test_each_broken_rule_is_named(cls, cases, rule):
    with pytest.raises(AssertionError, match=None) as err:
        check_environment(cls, cases=cases)
    assert rule in str(err.value)
    assert str(err.value).count("\n") == 0
