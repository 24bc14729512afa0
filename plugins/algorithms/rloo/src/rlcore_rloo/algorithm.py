"""RLOO: REINFORCE with a leave-one-out baseline over the samples of each prompt."""

from __future__ import annotations

import attrs

from rlcore.rl.algorithm import PolicyGradientAlgorithm, adv_estimator_key

__all__ = ["RLOO"]


class RLOO(PolicyGradientAlgorithm):
    """REINFORCE leave-one-out (arXiv 2402.14740).

    Advantage of response i: ``score_i - mean of the other scores of its prompt`` (groups by
    ``non_tensor_batch["uid"]``, in any order); a group of one gets 0. The advantages come
    from the ``rloo`` estimator (``[algorithm] adv_estimator``); the loss is the shared
    policy loss (set ``clip_ratio_low``/``high`` large for plain REINFORCE).
    """

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        adv_estimator: str | None = adv_estimator_key(
            "rloo",
            "The advantage estimator; rloo: each response's score minus the mean of "
            "the other responses of its prompt.",
        )

    config: RLOO.Config
