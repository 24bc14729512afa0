"""HFRollout against rlcore's rollout and plugin-module conformance checks."""

from __future__ import annotations

import pytest
import torch

from rlcore.testing.conformance import check_plugin_module, check_rollout
from rlcore.testing.tiny_model import build_tiny_model
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)


def test_hf_plugin_module():
    assert check_plugin_module("rlcore_hf.plugin") == {"rollout/hf": "rlcore_hf.rollout:HFRollout"}


def test_hf_rollout_conformance(tmp_path):
    path = build_tiny_model(tmp_path / "model", hidden=64, layers=1, heads=2, kv_heads=1)
    check_rollout(HFRollout, model_path=str(path))
    check_rollout(HFRollout, HFRollout.Config(max_batch_size=1), model_path=str(path), seed=3)


# --- check_rollout fails each broken double with the rule it breaks -----------------------


class IgnoresTemperatureInLogProbs(HFRollout):
    """Samples at T but reports log-probs of the untempered distribution."""

    def generate(self, prompts, sampling):
        out = super().generate(prompts, sampling)
        if sampling.return_log_probs and sampling.temperature not in (0.0, 1.0):
            b = out.batch
            with torch.no_grad():
                logits = self.model(
                    input_ids=b["input_ids"],
                    attention_mask=b["attention_mask"],
                    position_ids=b["position_ids"],
                ).logits[:, -b["responses"].shape[1] - 1 : -1]
            logp = torch.log_softmax(logits.float(), -1)
            b["rollout_log_probs"] = (
                logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]
            )
        return out


class RepeatsEachRow(HFRollout):
    """Still expands n itself: two responses per input row."""

    def generate(self, prompts, sampling):
        return super().generate(prompts.repeat(2, interleave=True), sampling)


class ConfigWithoutAttrs(HFRollout):
    class Config(HFRollout.Config):  # the decorator forgotten: the field is dropped
        gpu_memory_utilization: float = 0.5


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("hf_negative") / "m", hidden=64, layers=1, heads=2, kv_heads=1
        )
    )


@pytest.mark.parametrize(
    ("cls", "rule"),
    [
        (IgnoresTemperatureInLogProbs, "temperature must not be ignored"),
        (RepeatsEachRow, "exactly one response per input row"),
        (ConfigWithoutAttrs, "Config must be decorated with @attrs.frozen"),
    ],
    ids=["temperature", "n-per-row", "config"],
)
def test_check_rollout_names_the_broken_rule(tiny_path, cls, rule):
    with pytest.raises(AssertionError, match=rule):
        check_rollout(cls, model_path=tiny_path)
