"""Minimal components for config and discovery tests. No torch: resolving them stays light."""

from __future__ import annotations

import attrs

from rlcore.interfaces import BaseAlgorithm, BaseEngine, BaseReward, BaseRollout


class FakeEngine(BaseEngine):
    @attrs.frozen(kw_only=True)
    class Config(BaseEngine.Config):
        reshard_after_forward: bool = True
        shards: int = attrs.field(default=1, validator=attrs.validators.ge(1))

    def forward_backward(self, batch, loss_fn, *, temperature, with_entropy=False):
        raise NotImplementedError

    def optimizer_step(self, *, lr):
        raise NotImplementedError

    def compute_log_prob(self, batch, *, temperature, with_entropy=False):
        raise NotImplementedError

    def export_hf(self, path):
        raise NotImplementedError

    def named_parameters_for_sync(self):
        raise NotImplementedError

    def save_checkpoint(self, path):
        raise NotImplementedError

    def load_checkpoint(self, path):
        raise NotImplementedError


class FakeRollout(BaseRollout):
    @attrs.frozen(kw_only=True)
    class Config(BaseRollout.Config):
        gpu_memory_utilization: float = attrs.field(
            default=0.5, validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)]
        )
        enforce_eager: bool = False

    def generate(self, prompts, sampling):
        raise NotImplementedError

    def update_weights(self, named_tensors):
        raise NotImplementedError


class NotARollout:
    """Registered as a rollout but does not subclass BaseRollout."""


class FakeReward(BaseReward):
    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        format_score: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))

    def score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if ground_truth in solution_str else self.config.format_score


class FakeExactReward(BaseReward):
    @attrs.frozen(kw_only=True)
    class Config(BaseReward.Config):
        strip: bool = True

    def score(self, data_source, solution_str, ground_truth, extra_info=None):
        answer = solution_str.strip() if self.config.strip else solution_str
        return float(answer == ground_truth)


class FakeAlgorithm(BaseAlgorithm):
    @attrs.frozen(kw_only=True)
    class Config(BaseAlgorithm.Config):
        clip_ratio: float = attrs.field(default=0.2, validator=attrs.validators.gt(0.0))
        kl_coef: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
        loss_agg_mode: str = attrs.field(
            default="token-mean",
            validator=attrs.validators.in_(("token-mean", "seq-mean-token-mean")),
        )

    @property
    def needs_reference(self):
        return self.config.kl_coef > 0

    def compute_advantages(self, batch):
        raise NotImplementedError

    def policy_loss(self, outputs, batch, totals):
        raise NotImplementedError
