"""Masked importance sampling beside the truncation (issue 44 item 4), against verl's formulas
(``verl/trainer/ppo/rollout_corr_helper.py``: ``compute_rollout_correction_weights`` with a
``"lower_upper"`` threshold, IcePop; ``compute_rollout_rejection_mask``, ``rollout_rs``).

Every case is worked by hand on the ratios r = pi_old / pi_rollout below (the rollout's
log-probs are 0, the old ones log r): row 0 has three tokens, row 1 two and one padding.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.interfaces import BatchTotals
from rlcore.protocol import DataProto
from rlcore.rl.algorithm import PolicyGradientAlgorithm
from rlcore.rl.rollout_is import (
    parse_rollout_rs,
    rollout_is_metrics,
    rollout_is_weights,
    rollout_rs_mask,
)

R = torch.tensor([[2.5, 1.0, 0.4], [1.2, 3.0, 1.0]], dtype=torch.float64)
OLD = torch.log(R)
ROLLOUT = torch.zeros_like(OLD)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _weights(level: str, lower: float | None) -> torch.Tensor:
    return rollout_is_weights(OLD, ROLLOUT, MASK, level=level, cap=2.0, lower=lower)


def test_truncation_unchanged():
    # TIS: min(r, 2) on valid tokens: 2.5 -> 2, 3.0 -> 2; padding 0.
    w = _weights("token", None)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 0.4], [1.2, 2.0, 0.0]], dtype=w.dtype))
    metrics = rollout_is_metrics(w, MASK, 2.0)
    assert metrics["actor/rollout_is_truncated_frac"] == pytest.approx(2 / 5)


def test_icepop_token_band_zeroes_weights_outside():
    # Band [0.5, 2]: 2.5 (above), 0.4 (below) and 3.0 (above) become 0; 1.0, 1.2 are kept.
    w = _weights("token", 0.5)
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0], [1.2, 0.0, 0.0]], dtype=w.dtype))
    metrics = rollout_is_metrics(w, MASK, 2.0, 0.5)
    assert metrics["actor/rollout_is_oob_ratio"] == pytest.approx(3 / 5)
    assert metrics["actor/rollout_is_mean"] == pytest.approx((1.0 + 1.2) / 5)


def test_icepop_sequence_band():
    # Row 0: 2.5 * 1.0 * 0.4 = 1.0, in the band: 1.0 on every token; row 1: 1.2 * 3 = 3.6: 0.
    w = _weights("sequence", 0.5)
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=w.dtype))


def _mask(option: str, threshold: str) -> tuple[list[list[int]], dict[str, float]]:
    mask, metrics = rollout_rs_mask(OLD, ROLLOUT, MASK, rollout_rs=option, threshold=threshold)
    return mask.tolist(), metrics


def test_token_k1_two_sided():
    # k1 = -log r in [log 0.5, log 2] <=> 0.5 <= r <= 2: rejects 2.5, 0.4, 3.0.
    mask, metrics = _mask("token_k1", "0.5_2.0")
    assert mask == [[0, 1, 0], [1, 0, 0]]
    assert metrics["actor/rollout_rs_token_k1_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["actor/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["actor/rollout_rs_seq_masked_fraction"] == 1.0
    # One number u for a k1 option is the band [1/u, u] (verl's default lower).
    assert _mask("token_k1", "2.0")[0] == mask


def test_sequence_masks():
    # seq_sum_k1: -log(prod r): row 0 prod 1.0 (kept), row 1 prod 3.6 > 2 (all rejected).
    mask, metrics = _mask("seq_sum_k1", "0.5_2.0")
    assert mask == [[1, 1, 1], [0, 0, 0]]
    assert metrics["actor/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["actor/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    # seq_mean_k3, k3 = r - 1 - log r: row 0 (1.5 - log 2.5 + 0 + (-0.6 - log 0.4)) / 3 = 0.3,
    # row 1 (0.2 - log 1.2 + 2 - log 3) / 2 = 0.4595: bound 0.35 keeps row 0 only.
    row0 = (1.5 - math.log(2.5) - 0.6 - math.log(0.4)) / 3
    assert row0 == pytest.approx(0.3)
    assert _mask("seq_mean_k3", "0.35")[0] == [[1, 1, 1], [0, 0, 0]]
    assert _mask("seq_mean_k3", "0.5")[0] == [[1, 1, 1], [1, 1, 0]]
    # seq_max_k2, k2 = (log r)^2 / 2: row 0 max 0.4199 (2.5 and 0.4), row 1 0.6035 (3.0).
    assert _mask("seq_max_k2", "0.5")[0] == [[1, 1, 1], [0, 0, 0]]


def test_options_combine_and_each_reports():
    # token_k2 <= 0.3 keeps [[0,1,0],[1,0,-]]; seq_sum_k1 keeps row 0: both must pass.
    mask, metrics = _mask("token_k2,seq_sum_k1", "0.3,0.5_2.0")
    assert mask == [[0, 1, 0], [0, 0, 0]]
    assert metrics["actor/rollout_rs_token_k2_masked_fraction"] == pytest.approx(3 / 5)
    assert metrics["actor/rollout_rs_seq_sum_k1_masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["actor/rollout_rs_masked_fraction"] == pytest.approx(4 / 5)


@pytest.mark.parametrize(
    ("option", "threshold", "message"),
    [
        ("token_k9", "2.0", "unknown option"),
        ("token_k1", None, "needs rollout_rs_threshold"),
        ("token_k2", "0.5_2.0", "one upper bound"),
        ("token_k1", "2.0_0.5", "0 < lower <= upper"),
        ("token_k1,token_k2", "1,2,3", "3 thresholds for 2"),
        ("token_k3", "abc", "not a number"),
    ],
)
def test_bad_thresholds_one_line(option, threshold, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_rollout_rs(option, threshold)
    assert "\n" not in str(err.value)


def test_the_algorithm_masks_on_the_driver_and_weights_in_the_loss():
    algo = PolicyGradientAlgorithm(
        PolicyGradientAlgorithm.Config(
            rollout_rs="token_k1",
            rollout_rs_threshold="0.5_2.0",
            rollout_is="token",
            rollout_is_threshold_lower=0.5,
        )
    )
    assert algo.needs.rollout_log_probs
    assert algo.needs.old_log_probs_on_driver  # the mask needs pi_old before the update
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.ones(2, 3),
            "old_log_probs": OLD.float(),
            "rollout_log_probs": ROLLOUT.float(),
            "response_mask": MASK.clone(),
        }
    )
    batch, metrics = algo.compute_rewards(batch)
    assert batch.batch["response_mask"].tolist() == [[0, 1, 0], [1, 0, 0]]
    assert metrics["actor/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="rollout_is_threshold_lower must be in"):
        PolicyGradientAlgorithm.Config(rollout_is_threshold_lower=3.0)
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        PolicyGradientAlgorithm.Config(rollout_rs="seq_mean_k3")


def test_icepop_weights_reach_the_loss():
    # vanilla PG at ratio 1 (log_prob == old): the token loss is -A * w; A = 1, token-mean.
    algo = PolicyGradientAlgorithm(
        PolicyGradientAlgorithm.Config(
            rollout_is="token", rollout_is_cap=2.0, rollout_is_threshold_lower=0.5
        )
    )
    from rlcore.interfaces import ModelOutputs

    log_prob = OLD.float().clone().requires_grad_(True)
    batch = DataProto.from_dict(
        tensors={
            "old_log_probs": OLD.float(),
            "rollout_log_probs": ROLLOUT.float(),
            "response_mask": MASK,
            "advantages": torch.ones(2, 3),
        }
    )
    totals = BatchTotals(tokens=5, sequences=2, max_response_length=3)
    loss, metrics = algo.policy_loss(ModelOutputs(log_probs=log_prob), batch, totals)
    # Weights [[0, 1, 0], [1.2, 0, 0]]: loss = -(1 + 1.2) / 5.
    assert float(loss.detach()) == pytest.approx(-(1.0 + 1.2) / 5, abs=1e-6)
    assert metrics["actor/rollout_is_oob_ratio"] == pytest.approx(3 / 5)
