"""PPO: GAE advantages from a critic, the clipped policy loss, and the clipped value loss."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from rlcore.interfaces import BatchTotals, ModelOutputs, key
from rlcore.rl.algorithm import PolicyGradientAlgorithm, adv_estimator_key, require
from rlcore.rl.losses import LOSS_AGG_MODES, LossAggMode, compute_value_loss
from rlcore.rl.masked import masked_mean

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = ["PPO"]

_v = attrs.validators


class PPO(PolicyGradientAlgorithm):
    """Proximal policy optimisation with a learned critic (``needs_critic``)."""

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        """PPO's options on top of the shared ones.

        - ``gamma`` / ``lam``: GAE discount and lambda (1.0 / 1.0: verl's defaults for LLMs).
        - ``adv_estimator``: ``gae`` (the critic's values; the registry's other estimators
          ignore them, the critic is still trained).
        - ``cliprange_value``: how far the new value may move from the old one in the loss.
        - ``value_loss_agg_mode``: aggregation of the value loss (``token-mean`` as verl).
        """

        gamma: float = key(1.0, "GAE discount.", validator=[_v.ge(0.0), _v.le(1.0)])
        lam: float = key(1.0, "GAE lambda.", validator=[_v.ge(0.0), _v.le(1.0)])
        adv_estimator: str | None = adv_estimator_key(
            "gae",
            "The advantage estimator; gae: from the critic's values (gamma, lam).",
        )
        cliprange_value: float = key(
            0.5,
            "Value clipping: how far the new value may move from the old one in the value loss.",
            validator=_v.gt(0.0),
        )
        value_loss_agg_mode: LossAggMode = key(
            "token-mean",
            "How token value losses become the mini-batch's value loss.",
            validator=_v.in_(LOSS_AGG_MODES),
        )

    config: PPO.Config

    @property
    def needs_critic(self) -> bool:
        return True

    def value_loss(
        self, outputs: ModelOutputs, batch: DataProto, totals: BatchTotals
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``0.5 * agg(max((v - R)^2, (v_clip - R)^2))`` over the mini-batch ``totals``."""
        if outputs.values is None:
            msg = "value_loss needs outputs.values (with gradient)"
            raise ValueError(msg)
        vpreds = outputs.values  # (b, R)
        mask = require(batch, "response_mask")
        mode = self.config.value_loss_agg_mode
        loss, clipfrac = compute_value_loss(
            vpreds,
            require(batch, "returns").to(vpreds.dtype),
            require(batch, "values").to(vpreds.dtype),
            mask,
            cliprange_value=self.config.cliprange_value,
            loss_agg_mode=mode,
            totals=totals,
        )
        # This micro-batch's own aggregate, for logging (the loss is over mini-batch totals).
        with torch.no_grad():
            local = compute_value_loss(
                vpreds.detach(),
                require(batch, "returns").to(vpreds.dtype),
                require(batch, "values").to(vpreds.dtype),
                mask,
                cliprange_value=self.config.cliprange_value,
                loss_agg_mode=mode,
            )[0]
        metrics = {
            "critic/vf_loss": float(local.item()),
            "critic/vf_clipfrac": float(clipfrac.item()),
            "critic/vpred_mean": float(masked_mean(vpreds.detach(), mask).item()),
        }
        return loss, metrics
