"""``PolicyGradientAlgorithm``: the combined actor loss (PG + KL loss - entropy bonus), KL in the
reward with its driver-side controller, Config validation, and split-invariance on DataProto."""

from __future__ import annotations

import subprocess
import sys

import attrs
import cattrs
import numpy as np
import pytest
import torch

from rlcore.interfaces import BatchTotals, ModelOutputs
from rlcore.protocol import DataProto
from rlcore.rl.advantages import compute_grpo_outcome_advantage
from rlcore.rl.algorithm import POLICY_LOSSES, KLControlConfig, PolicyGradientAlgorithm
from rlcore.rl.kl import kl_penalty
from rlcore.rl.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_vanilla,
    local_totals,
)
from rlcore.rl.rollout_is import rollout_is_weights


class GroupAlgorithm(PolicyGradientAlgorithm):
    """The smallest concrete subclass: the base class is what is under test."""

    @attrs.frozen(kw_only=True)
    class Config(PolicyGradientAlgorithm.Config):
        pass

    def compute_advantages(self, batch: DataProto) -> DataProto:
        adv, ret = compute_grpo_outcome_advantage(
            batch.batch["token_level_rewards"],
            batch.batch["response_mask"],
            batch.non_tensor_batch["uid"],
        )
        batch.batch["advantages"] = adv
        batch.batch["returns"] = ret
        return batch


def make_batch(seed: int, rows: int = 12, length: int = 10) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    old = -torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2
    return DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "old_log_probs": old,
            "ref_log_prob": old
            + 0.3 * torch.randn(rows, length, generator=gen, dtype=torch.float64),
            "advantages": torch.randn(rows, length, generator=gen, dtype=torch.float64) * mask,
            "token_level_scores": torch.randn(rows, length, generator=gen, dtype=torch.float64)
            * mask,
            "log_probs": old + 0.4 * torch.randn(rows, length, generator=gen, dtype=torch.float64),
            "rollout_log_probs": old
            + 0.2 * torch.randn(rows, length, generator=gen, dtype=torch.float64),
            "entropy": torch.rand(rows, length, generator=gen, dtype=torch.float64) * 3,
        },
        non_tensors={"uid": np.array([f"p{i % 4}" for i in range(rows)], dtype=object)},
    )


def outputs_of(batch: DataProto, leaf_lp: torch.Tensor, leaf_ent: torch.Tensor) -> ModelOutputs:
    return ModelOutputs(log_probs=leaf_lp, entropy=leaf_ent)


# --- the combined loss ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("kl_type", ["low_var_kl", "k3+", "k1"])
def test_policy_loss_combines_pg_kl_and_entropy(mode, kl_type):
    batch = make_batch(0)
    cfg = GroupAlgorithm.Config(
        loss_agg_mode=mode, use_kl_loss=True, kl_loss_coef=0.05, kl_loss_type=kl_type,
        entropy_coeff=0.01, clip_ratio_high=0.28,
    )  # fmt: skip
    algo = GroupAlgorithm(cfg)
    b = batch.batch
    totals = BatchTotals(
        tokens=int(b["response_mask"].sum()) + 5, sequences=15, max_response_length=10
    )
    lp = b["log_probs"].clone().requires_grad_(True)
    ent = b["entropy"].clone().requires_grad_(True)
    loss, metrics = algo.policy_loss(ModelOutputs(log_probs=lp, entropy=ent), batch, totals)
    loss.backward()

    # Expected: the same terms assembled by hand from the (separately tested) pieces.
    lp2 = b["log_probs"].clone().requires_grad_(True)
    ent2 = b["entropy"].clone().requires_grad_(True)
    mask = b["response_mask"]
    pg = compute_policy_loss_vanilla(
        b["old_log_probs"], lp2, b["advantages"], mask,
        loss_agg_mode=mode, config=cfg, totals=totals,
    )[0]  # fmt: skip
    kl = agg_loss(kl_penalty(lp2, b["ref_log_prob"], kl_type), mask, mode, totals)
    expected = pg + 0.05 * kl - 0.01 * agg_loss(ent2, mask, mode, totals)
    expected.backward()
    assert abs(loss.item() - expected.item()) <= 1e-12
    assert float((lp.grad - lp2.grad).abs().max()) <= 1e-12
    assert float((ent.grad - ent2.grad).abs().max()) <= 1e-12
    assert float(ent.grad.abs().max()) > 0
    # Metrics are this micro-batch's own aggregates.
    local = local_totals(mask)
    with torch.no_grad():
        pg_local = compute_policy_loss_vanilla(
            b["old_log_probs"], lp2, b["advantages"], mask,
            loss_agg_mode=mode, config=cfg, totals=local,
        )[0]  # fmt: skip
        kl_local = agg_loss(kl_penalty(lp2, b["ref_log_prob"], kl_type), mask, mode, local)
    assert metrics["actor/pg_loss"] == pytest.approx(pg_local.item(), abs=1e-12)
    assert metrics["actor/kl_loss"] == pytest.approx(kl_local.item(), abs=1e-12)
    assert metrics["actor/entropy"] == pytest.approx(
        agg_loss(ent2, mask, mode, local).item(), abs=1e-12
    )
    assert metrics["actor/kl_coef"] == 0.05
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
# kl_cov picks its tokens per micro-batch (as verl): its gradient depends on the split.
@pytest.mark.parametrize("policy_loss", [p for p in POLICY_LOSSES if p != "kl_cov"])
@pytest.mark.parametrize("rollout_is", ["none", "token", "sequence"])
def test_policy_loss_gradient_independent_of_split(mode, policy_loss, rollout_is):
    """One mini-batch vs the same rows as micro-batches of unequal token counts."""
    batch = make_batch(1, rows=12)
    cfg = GroupAlgorithm.Config(
        loss_agg_mode=mode,
        policy_loss=policy_loss,
        use_kl_loss=True,
        entropy_coeff=0.02,
        rollout_is=rollout_is,
    )
    algo = GroupAlgorithm(cfg)
    totals = local_totals(batch.batch["response_mask"])

    def grads(splits: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        lp = batch.batch["log_probs"].clone().requires_grad_(True)
        ent = batch.batch["entropy"].clone().requires_grad_(True)
        for rows in splits:
            idx = torch.tensor(rows)
            loss, _ = algo.policy_loss(
                ModelOutputs(log_probs=lp[idx], entropy=ent[idx]), batch[rows], totals
            )
            loss.backward()
        return lp.grad, ent.grad

    whole = grads([list(range(12))])
    split = grads([[0, 1, 2, 3, 4, 5, 6], [7], [8, 9, 10, 11]])
    for a, b in zip(whole, split):
        assert float((a - b).abs().max()) <= 1e-12
        assert float(a.abs().max()) > 0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_is_in_the_algorithm_is_the_weighted_loss(level):
    batch = make_batch(3, rows=12)
    t = batch.batch
    algo = GroupAlgorithm(
        GroupAlgorithm.Config(policy_loss="cispo", rollout_is=level, rollout_is_cap=1.2)
    )
    totals = local_totals(t["response_mask"])
    loss, metrics = algo.policy_loss(ModelOutputs(log_probs=t["log_probs"]), batch, totals)
    w = rollout_is_weights(
        t["old_log_probs"], t["rollout_log_probs"], t["response_mask"], level=level, cap=1.2
    )
    want = compute_policy_loss_cispo(
        t["old_log_probs"], t["log_probs"], t["advantages"], t["response_mask"],
        loss_agg_mode="token-mean", config=algo.config, totals=totals, rollout_is_weights=w,
    )[0]  # fmt: skip
    assert abs(float(loss.detach()) - float(want.detach())) <= 1e-12
    assert 0.0 < metrics["actor/rollout_is_truncated_frac"] < 1.0
    batch.pop(batch_keys=["rollout_log_probs"])
    with pytest.raises(KeyError, match="rollout_log_probs"):
        algo.policy_loss(ModelOutputs(log_probs=t["log_probs"]), batch, totals)


def test_policy_loss_missing_inputs_are_named():
    batch = make_batch(2)
    totals = local_totals(batch.batch["response_mask"])
    algo = GroupAlgorithm(GroupAlgorithm.Config(entropy_coeff=0.1))
    lp = batch.batch["log_probs"]
    with pytest.raises(ValueError, match=r"needs outputs\.entropy"):
        algo.policy_loss(ModelOutputs(log_probs=lp), batch, totals)
    with pytest.raises(ValueError, match=r"needs outputs\.log_probs"):
        algo.policy_loss(ModelOutputs(), batch, totals)
    batch.batch.pop("ref_log_prob")
    algo = GroupAlgorithm(GroupAlgorithm.Config(use_kl_loss=True))
    with pytest.raises(KeyError, match="ref_log_prob"):
        algo.policy_loss(ModelOutputs(log_probs=lp), batch, totals)


# --- rewards and the driver-side KL controller ------------------------------------------------


def test_compute_rewards_copies_scores_without_kl():
    batch = make_batch(3)
    algo = GroupAlgorithm(GroupAlgorithm.Config())
    assert not algo.needs_reference
    out, metrics = algo.compute_rewards(batch)
    assert torch.equal(out.batch["token_level_rewards"], batch.batch["token_level_scores"])
    assert metrics == {}


def test_compute_rewards_with_adaptive_kl_updates_the_driver_state():
    cfg = GroupAlgorithm.Config(
        use_kl_in_reward=True,
        kl_penalty="kl",
        kl_ctrl=KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.01, horizon=100),
    )
    algo = GroupAlgorithm(cfg)
    assert algo.needs_reference
    batch = make_batch(4)
    b = batch.batch
    mask = b["response_mask"]
    out, metrics = algo.compute_rewards(batch)
    kl = (b["old_log_probs"] - b["ref_log_prob"]) * mask
    assert (
        float((out.batch["token_level_rewards"] - (b["token_level_scores"] - 0.1 * kl)).abs().max())
        <= 1e-12
    )
    row_means = [
        float(kl[i].sum() / mask[i].sum()) if mask[i].sum() else 0.0 for i in range(len(batch))
    ]
    current = sum(row_means) / len(row_means)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current, abs=1e-12)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    err = min(max(current / 0.01 - 1, -0.2), 0.2)
    assert algo.kl_ctrl.value == pytest.approx(0.1 * (1 + err * len(batch) / 100), rel=1e-12)
    # checkpointed with the trainer
    fresh = GroupAlgorithm(cfg)
    fresh.load_state_dict(algo.state_dict())
    assert fresh.kl_ctrl.value == algo.kl_ctrl.value


def test_compute_advantages_shuffled_groups_via_dataproto():
    batch = make_batch(5)
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    perm = np.random.default_rng(0).permutation(len(batch))
    shuffled = batch[perm]
    a = GroupAlgorithm(GroupAlgorithm.Config()).compute_advantages(batch).batch["advantages"]
    s = GroupAlgorithm(GroupAlgorithm.Config()).compute_advantages(shuffled).batch["advantages"]
    assert float((s - a[torch.from_numpy(perm)]).abs().max()) <= 1e-12


# --- Config -----------------------------------------------------------------------------------


def test_config_defaults():
    cfg = PolicyGradientAlgorithm.Config()
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c) == (0.2, 0.2, 3.0)
    assert cfg.loss_agg_mode == "token-mean"
    assert cfg.policy_loss == "vanilla"
    assert (cfg.use_kl_loss, cfg.kl_loss_coef, cfg.kl_loss_type) == (False, 0.001, "low_var_kl")
    assert (cfg.use_kl_in_reward, cfg.kl_penalty, cfg.kl_ctrl.type) == (False, "kl", "fixed")
    assert cfg.entropy_coeff == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_ratio_c": 1.0}, "'clip_ratio_c' must be > 1.0"),
        ({"clip_ratio_low": 1.0}, "'clip_ratio_low' must be < 1.0"),
        ({"loss_agg_mode": "token-total"}, "'loss_agg_mode' must be in"),
        ({"rollout_is": "seq"}, "'rollout_is' must be in"),
        ({"rollout_is_cap": 0.0}, "'rollout_is_cap' must be >"),
        ({"sapo_tau_neg": 0.0}, "'sapo_tau_neg' must be >"),
        ({"kl_loss_type": "k4"}, "'kl_loss_type' must be in"),
        (
            {"policy_loss": "ppo"},
            r"^unknown policy loss 'ppo'\. Registered: cispo, gmpo, gpg, gspo, kl_cov, sapo, "
            r"vanilla\.$",
        ),
        (
            {"adv_estimator": "gae"},
            "^advantage estimator 'gae' reads the options gamma, lam, which algorithm "
            "PolicyGradientAlgorithm does not have$",
        ),
        ({"adv_estimator": "gea"}, r"^unknown advantage estimator 'gea'\. Registered: gae, "),
    ],
)
def test_config_validators(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyGradientAlgorithm.Config(**kwargs)


def test_unknown_key_is_rejected_by_a_strict_converter():
    """What the config loader does with ``[algorithm]`` (extra keys forbidden)."""
    conv = cattrs.Converter(forbid_extra_keys=True)
    cfg = conv.structure(
        {"clip_ratio_high": 0.28, "kl_ctrl": {"type": "adaptive"}}, PolicyGradientAlgorithm.Config
    )
    assert cfg.kl_ctrl.type == "adaptive"
    with pytest.raises(cattrs.ClassValidationError) as info:
        conv.structure({"kl_ctrl": {"target": 0.1}}, PolicyGradientAlgorithm.Config)
    assert "target" in "; ".join(cattrs.transform_error(info.value, path="$.algorithm"))


def test_importing_rlcore_does_not_import_rl_numerics():
    code = (
        "import sys, rlcore, rlcore.interfaces;"
        "print('rlcore.rl' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES)
def test_zero_advantage_rows_inert_only_where_their_gradient_is_zero(policy_loss):
    """The flag lets workers drop zero-advantage rows from the backward: it must be true only
    for losses under which such a row's gradient is exactly zero (kl_cov's penalty is not)."""
    batch = make_batch(3, rows=12)
    adv = batch.batch["advantages"]
    zero_rows = [1, 2, 5]
    adv[zero_rows] = 0.0
    algo = GroupAlgorithm(GroupAlgorithm.Config(policy_loss=policy_loss, kl_cov_ratio=0.5))
    lp = batch.batch["log_probs"].clone().requires_grad_(True)
    loss, _ = algo.policy_loss(
        ModelOutputs(log_probs=lp), batch, local_totals(batch.batch["response_mask"])
    )
    loss.backward()
    zero_grad = bool((lp.grad[zero_rows] == 0).all())
    assert algo.zero_advantage_rows_inert == (policy_loss != "kl_cov")
    if algo.zero_advantage_rows_inert:
        assert zero_grad
    else:
        assert not zero_grad  # kl_cov: the penalty on the chosen tokens has a gradient


def test_a_plugin_loss_is_not_assumed_inert():
    algo = GroupAlgorithm(GroupAlgorithm.Config())
    assert algo.zero_advantage_rows_inert
    assert algo.needs.zero_advantage_rows_inert
    custom = attrs.evolve(algo.config, policy_loss="vanilla")
    object.__setattr__(custom, "policy_loss", "someone_elses_loss")  # skips name validation
    assert not GroupAlgorithm(custom).zero_advantage_rows_inert
