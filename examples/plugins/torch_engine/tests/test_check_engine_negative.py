"""check_engine fails each broken double of the example engine with the rule it breaks.

The doubles are the example engine with one defect each, the mistakes a contract-only engine
makes: per-micro-batch normalisation, temperature ignored, an LR schedule of its own, no or a
wrong ``export_hf``, a ``Config`` subclass without the attrs decorator.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import attrs
import pytest
import torch

from rlcore.engine import batch_totals, clip_and_step, split_micro_batches
from rlcore.interfaces import BaseEngine, ModelOutputs
from rlcore.testing.conformance import check_engine
from rlcore_torch_engine.engine import TorchEngine

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.runs import tiny_run_model

    return str(tiny_run_model(tmp_path_factory.mktemp("negative") / "model"))


class PerMicroBatchTotals(TorchEngine):
    """Normalises each micro-batch by its own counts: the gradient depends on the split."""

    def forward_backward(self, batch, loss_fn, *, temperature, with_entropy=False):
        self.model.train()
        for mb in split_micro_batches(
            batch, micro_batch_size=self.spec.micro_batch_size, max_tokens=None
        ):
            loss, _ = loss_fn(self._forward(mb, temperature, with_entropy), mb, batch_totals(mb))
            loss.backward()
        return {}


class IgnoresTemperature(TorchEngine):
    def _forward(self, mb, temperature, entropy) -> ModelOutputs:
        return super()._forward(mb, 1.0, entropy)


class OwnSchedule(TorchEngine):
    """Ignores the lr it is given and runs its own constant schedule at optim.lr."""

    def optimizer_step(self, *, lr):
        return clip_and_step(
            self.optimizer, self.model.parameters(), lr=self.spec.optim.lr, max_norm=1.0
        )


class NoExport(TorchEngine):
    export_hf = BaseEngine.export_hf  # abstract again: the method is missing


class ExportsTheBaseModel(TorchEngine):
    """Writes the untrained model_path folder instead of the engine's weights."""

    def export_hf(self, path):
        shutil.copytree(self.spec.model_path, Path(path))


class ConfigWithoutAttrs(TorchEngine):
    class Config(TorchEngine.Config):  # the decorator forgotten: `layers` is dropped
        layers: int = 2


@pytest.mark.parametrize(
    ("cls", "rule"),
    [
        (PerMicroBatchTotals, "BatchTotals of the whole mini-batch"),
        (IgnoresTemperature, "temperature must not be ignored"),
        (OwnSchedule, "must apply exactly the lr it is given"),
        (NoExport, r"must implement every abstract method.*\['export_hf'\]"),
        (ExportsTheBaseModel, "export_hf must write .* the engine's current weights"),
        (ConfigWithoutAttrs, r"Config must be decorated with @attrs.frozen"),
    ],
    ids=["per-micro-batch", "temperature", "lr-schedule", "no-export", "wrong-export", "config"],
)
def test_check_engine_names_the_broken_rule(tiny_path, cls, rule):
    with pytest.raises(AssertionError, match=rule):
        check_engine(cls, model_path=tiny_path)


def test_the_undecorated_config_really_drops_its_field():
    assert "layers" not in {f.name for f in attrs.fields(ConfigWithoutAttrs.Config)}


def test_critic_check_fails_an_engine_without_a_value_head(tiny_path):
    with pytest.raises(AssertionError, match="must implement compute_values"):
        check_engine(TorchEngine, model_path=tiny_path, critic=True)


class SGDEngine(TorchEngine):
    """A correct engine on plain SGD (with momentum): its step is lr x gradient, not ~lr."""

    def __init__(self, spec, config=None):
        super().__init__(spec, config)
        if self.optimizer is not None:
            self.optimizer = torch.optim.SGD(
                self.model.parameters(), lr=spec.optim.lr, momentum=0.9
            )
            self.guard = type(self.guard)(self.optimizer, role=spec.role, max_norm=spec.grad_clip)


def test_an_sgd_engine_passes(tiny_path):
    check_engine(SGDEngine, model_path=tiny_path)


class TwoDefects(IgnoresTemperature, OwnSchedule):
    """Temperature ignored and an LR schedule of its own: both rules are reported."""


def test_every_broken_rule_is_reported_not_only_the_first(tiny_path):
    with pytest.raises(AssertionError) as info:
        check_engine(TwoDefects, model_path=tiny_path)
    message = str(info.value)
    assert "rules broken" in message, message
    assert "temperature must not be ignored" in message, message
    assert "must apply exactly the lr it is given" in message, message


class DividesByZeroTemperature(TorchEngine):
    def _forward(self, mb, temperature, entropy) -> ModelOutputs:
        if temperature == 0.0:
            temperature = 1e-6  # a greedy sample scored as a near-one-hot distribution
        return super()._forward(mb, temperature, entropy)


def test_temperature_zero_must_score_the_unscaled_logits(tiny_path):
    with pytest.raises(AssertionError, match=r"temperature=0\) must"):
        check_engine(DividesByZeroTemperature, model_path=tiny_path)
