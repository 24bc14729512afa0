"""GRPO (and Dr. GRPO) and REINFORCE++: critic-free outcome-reward advantages.

Both take their advantages from the estimator registry (``[algorithm] adv_estimator``,
:mod:`rlcore.rl.registry`); this module gives each its default and the options it reads.
"""

from __future__ import annotations

import attrs

from rlcore.interfaces import key
from rlcore.rl.advantages import GRPOOptions
from rlcore.rl.algorithm import PolicyGradientAlgorithm, adv_estimator_key

__all__ = ["GRPO", "ReinforcePlusPlus"]

_v = attrs.validators


class GRPO(PolicyGradientAlgorithm):
    """Group relative policy optimisation (DeepSeekMath): responses to one prompt are a group.

    Advantage of response i in group g: ``(score_i - mean_g) / (std_g + epsilon)``, or
    ``score_i - mean_g`` with ``norm_adv_by_std = false`` (Dr. GRPO, arXiv 2503.20783, which
    also uses ``loss_agg_mode = "seq-mean-token-sum-norm"``). Groups are read from
    ``non_tensor_batch["uid"]`` in any order; a group of one gets advantage 0.
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config, GRPOOptions):
        adv_estimator: str | None = adv_estimator_key(
            "grpo",
            "The advantage estimator; grpo: each response's score minus its group's "
            "mean, over the group's std + epsilon.",
        )

    config: GRPO.Config


class ReinforcePlusPlus(PolicyGradientAlgorithm):
    """REINFORCE++ (arXiv 2501.03262): batch-whitened returns, no critic.

    ``adv_estimator = "reinforce_plus_plus"``: discounted token returns (``gamma``) whitened
    over the batch. ``"reinforce_plus_plus_baseline"``: outcome score minus its group's mean
    (uid), then whitened (verl's names).
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        adv_estimator: str | None = adv_estimator_key(
            "reinforce_plus_plus",
            "The advantage estimator; reinforce_plus_plus: discounted token returns "
            "whitened over the batch; reinforce_plus_plus_baseline: score minus its "
            "group's mean, whitened.",
        )
        gamma: float = key(
            1.0,
            "Discount of the token returns (reinforce_plus_plus).",
            validator=[_v.ge(0.0), _v.le(1.0)],
        )

    config: ReinforcePlusPlus.Config
