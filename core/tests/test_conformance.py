"""rlcore.testing.conformance: each check passes a correct double and fails a broken one.

The first-party plugins run the same checks in their own ``test_*_conformance.py`` files;
here the doubles are built from the core only (no plugin imports), so every rule that a
check enforces is shown to be able to fail, with its message.
"""

from __future__ import annotations

import re
import textwrap
import time
from typing import Any

import attrs
import pytest
import torch

from rlcore.interfaces import BaseReward, BatchTotals, ModelOutputs
from rlcore.protocol import DataProto
from rlcore.rl.advantages import compute_rloo_outcome_advantage
from rlcore.rl.algorithm import PolicyGradientAlgorithm, require
from rlcore.testing.conformance import check_algorithm, check_plugin_module, check_reward

torch.set_num_threads(1)


# --- rewards ------------------------------------------------------------------------------


class ExactReward(BaseReward):
    """A correct reward: 1.0 when the last line equals the ground truth."""

    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        score: float = 1.0

    def __init__(self, config: ExactReward.Config | None = None) -> None:
        super().__init__(config or ExactReward.Config())
        self.config: ExactReward.Config

    def score(self, data_source, solution_str, ground_truth, extra_info=None) -> Any:
        lines = solution_str[-200:].strip().splitlines() or [""]
        acc = lines[-1].strip() == ground_truth.strip()
        return {"score": self.config.score if acc else 0.0, "acc": acc}


class RaisesOnLongInput(ExactReward):
    def score(self, data_source, solution_str, ground_truth, extra_info=None) -> Any:
        if len(solution_str) > 10_000:
            raise RecursionError("maximum recursion depth exceeded")
        return super().score(data_source, solution_str, ground_truth, extra_info)


class SlowReward(ExactReward):
    def score(self, data_source, solution_str, ground_truth, extra_info=None) -> Any:
        time.sleep(0.05)
        return super().score(data_source, solution_str, ground_truth, extra_info)


class CountingReward(ExactReward):
    """Not deterministic: the score depends on how often it was called."""

    calls = 0

    def score(self, data_source, solution_str, ground_truth, extra_info=None) -> Any:
        type(self).calls += 1
        return float(type(self).calls % 2)


class BoolScoreReward(ExactReward):
    def score(self, data_source, solution_str, ground_truth, extra_info=None) -> Any:
        return {"score": True}


class PositionalConfigReward(ExactReward):
    @attrs.frozen  # kw_only not re-applied
    class Config(BaseReward.Config):
        score: float = 1.0


class MutableConfigReward(ExactReward):
    @attrs.define(kw_only=True)
    class Config:  # a subclass of the frozen BaseReward.Config would inherit frozen
        score: float = 1.0


class RequiredKeyReward(ExactReward):
    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        threshold: float  # no default: required, so check_reward needs config=


class UnpicklableReward(ExactReward):
    def __init__(self, config: ExactReward.Config | None = None) -> None:
        super().__init__(config)
        self.cache = lambda x: x  # lambdas do not pickle


def test_check_reward_passes_a_correct_reward():
    check_reward(ExactReward, cases=[("work\n42", "42", 1.0), ("41", "42", 0.0)])


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (RaisesOnLongInput, {}, "score must never raise on model output: 100 kB of digits"),
        (SlowReward, {"time_limit_s": 0.01}, "score must return within time_limit_s=0.01"),
        (CountingReward, {}, "score must be deterministic"),
        (BoolScoreReward, {}, "a finite float 'score'"),
        (PositionalConfigReward, {}, "Config fields must be keyword-only"),
        (MutableConfigReward, {}, "Config must be frozen"),
        (RequiredKeyReward, {}, "a Config with required keys needs config="),
        (UnpicklableReward, {}, "the reward must pickle"),
        (ExactReward, {"cases": [("42", "42", 0.5)]}, "author case scored wrong"),
    ],
)
def test_check_reward_names_the_broken_rule(cls, kwargs, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        check_reward(cls, **kwargs)


def test_check_reward_refuses_a_class_defined_in_a_function():
    class Local(ExactReward):
        pass

    with pytest.raises(AssertionError, match="importable by module path"):
        check_reward(Local)


def test_check_reward_refuses_a_non_reward():
    with pytest.raises(AssertionError, match=r"must subclass rlcore\.interfaces\.BaseReward"):
        check_reward(dict)  # type: ignore[arg-type]


# --- algorithms ---------------------------------------------------------------------------


class LeaveOneOut(PolicyGradientAlgorithm):
    """A correct algorithm: RLOO from the core's estimators and the shared losses."""

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        pass

    def compute_advantages(self, batch: DataProto) -> DataProto:
        adv, ret = compute_rloo_outcome_advantage(
            require(batch, "token_level_rewards"),
            require(batch, "response_mask"),
            batch.non_tensor_batch["uid"],
        )
        batch.batch["advantages"], batch.batch["returns"] = adv, ret
        return batch


class LeakyAdvantages(LeaveOneOut):
    """Broadcasts the outcome over all R positions, padding included."""

    def compute_advantages(self, batch: DataProto) -> DataProto:
        score = require(batch, "token_level_rewards").sum(-1, keepdim=True)  # (B, 1)
        adv = score.expand_as(batch.batch["response_mask"]).clone()
        batch.batch["advantages"], batch.batch["returns"] = adv, adv.clone()
        return batch


class OrderDependent(LeaveOneOut):
    """Groups by position (rows i, i+1) instead of uid."""

    def compute_advantages(self, batch: DataProto) -> DataProto:
        mask = require(batch, "response_mask")
        score = require(batch, "token_level_rewards").sum(-1)
        adv = score - score.roll(1)
        batch.batch["advantages"] = adv.unsqueeze(-1) * mask
        batch.batch["returns"] = batch.batch["advantages"].clone()
        return batch


class LocalMeanLoss(LeaveOneOut):
    """Normalises by the micro-batch's own token count: not split-invariant."""

    def policy_loss(self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals):
        mask = require(batch, "response_mask").to(outputs.log_probs.dtype)
        adv = require(batch, "advantages")
        loss = -(outputs.log_probs * adv * mask).sum() / mask.sum().clamp(min=1)
        _, metrics = super().policy_loss(outputs, batch, totals)
        return loss, metrics


class DetachedLoss(LeaveOneOut):
    def policy_loss(self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals):
        loss, metrics = super().policy_loss(outputs, batch, totals)
        return loss.detach(), metrics


class PaddingLoss(LeaveOneOut):
    """Adds a term on every position: the gradient reaches padding."""

    def policy_loss(self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals):
        loss, metrics = super().policy_loss(outputs, batch, totals)
        return loss + 1e-3 * outputs.log_probs.sum() / totals.sequences, metrics


class TensorMetric(LeaveOneOut):
    def policy_loss(self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals):
        loss, metrics = super().policy_loss(outputs, batch, totals)
        return loss, {**metrics, "actor/pg_loss": loss.detach()}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_check_algorithm_passes_a_correct_algorithm(mode, use_kl_loss):
    cfg = LeaveOneOut.Config(loss_agg_mode=mode, use_kl_loss=use_kl_loss, entropy_coeff=0.01)
    check_algorithm(LeaveOneOut, cfg)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (LeakyAdvantages, "advantages must be zero outside response_mask"),
        (OrderDependent, "must not depend on the order of rows"),
        (LocalMeanLoss, "policy_loss must be split-invariant"),
        (DetachedLoss, "the loss carries no gradient"),
        (PaddingLoss, "policy_loss must not depend on tokens outside response_mask"),
        (TensorMetric, "metric 'actor/pg_loss' must be a Python float"),
    ],
)
def test_check_algorithm_names_the_broken_rule(cls, message):
    with pytest.raises(AssertionError, match=message):
        check_algorithm(cls)


def test_check_algorithm_requires_documented_metrics():
    with pytest.raises(AssertionError, match="missing documented metrics"):
        check_algorithm(LeaveOneOut, policy_metrics=("actor/pg_loss", "actor/not_reported"))


# --- plugin modules -----------------------------------------------------------------------


def _plugin(tmp_path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


GOOD = """
from rlcore.hookspecs import hookimpl

contract_version = 2

@hookimpl
def register_rewards():
    return {"exact": "some_pkg.reward:ExactReward"}
"""


def test_check_plugin_module_passes_a_light_module(tmp_path):
    name = _plugin(tmp_path, "conf_good_plugin", GOOD)
    found = check_plugin_module(name, sys_path=[tmp_path], resolve=False)
    assert found == {"reward/exact": "some_pkg.reward:ExactReward"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("import torch\n" + GOOD, "must not import torch/transformers/ray/vllm/sglang"),
        (
            GOOD.replace("return {", "import transformers\n    return {"),
            "imported .*transformers",
        ),
        (GOOD.replace("some_pkg.reward:ExactReward", "ExactReward"), "expected a name"),
        (GOOD.replace("register_rewards", "register_reward"), "did you mean 'register_rewards'"),
        ("contract_version = 2\nx = 1\n", "must implement at least one hook"),
        ("raise ImportError('no backend')\n", "ImportError: no backend"),
        (
            GOOD.replace("contract_version = 2\n", ""),
            "must declare contract_version = 2 at module level: written for plugin contract 1",
        ),
        (
            GOOD.replace("contract_version = 2", "contract_version = 1"),
            "must declare contract_version = 2 at module level: written for plugin contract 1,",
        ),
    ],
)
def test_check_plugin_module_names_the_broken_rule(tmp_path, body, message):
    name = _plugin(tmp_path, f"conf_bad_plugin_{abs(hash(body)) % 10**8}", body)
    with pytest.raises(AssertionError, match=message):
        check_plugin_module(name, sys_path=[tmp_path], resolve=False)


def test_check_plugin_module_resolves_targets(tmp_path):
    name = _plugin(tmp_path, "conf_unresolved_plugin", GOOD)
    with pytest.raises(AssertionError, match="every registered target must import"):
        check_plugin_module(name, sys_path=[tmp_path])
