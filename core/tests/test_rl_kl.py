"""KL estimators (values and gradients, ``+`` straight-through variants), controllers and the
KL penalty in the reward, against float64 references written as plain loops."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.rl.kl import KL_ESTIMATORS, KLController, apply_kl_penalty, kl_penalty

TOL = 1e-6


def ref_kl(lp: float, ref: float, name: str) -> tuple[float, float]:
    """(value, d value / d lp) of one estimator at one token."""
    base = name.removesuffix("+")
    d = lp - ref
    if base in ("kl", "k1"):
        value, grad = d, 1.0
    elif base == "abs":
        value, grad = abs(d), (1.0 if d > 0 else -1.0 if d < 0 else 0.0)
    elif base in ("mse", "k2"):
        value, grad = 0.5 * d * d, d
    else:  # k3 / low_var_kl with verl's clamps
        x = ref - lp
        xc = min(max(x, -20.0), 20.0)
        raw = math.exp(xc) - xc - 1.0
        value = min(max(raw, -10.0), 10.0)
        inside = -20.0 < x < 20.0 and -10.0 < raw < 10.0
        grad = -(math.exp(xc) - 1.0) if inside else 0.0
    if name.endswith("+"):
        grad = d  # gradient of k2, value unchanged
    return value, grad


def kl_inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ref = -torch.rand(6, 9, generator=gen, dtype=torch.float64) * 4
    lp = ref + torch.randn(6, 9, generator=gen, dtype=torch.float64)
    lp[0, :4] = ref[0, :4] + torch.tensor([25.0, -25.0, 3.0, -3.0], dtype=torch.float64)  # clamps
    return lp, ref


def test_estimator_names():
    assert set(KL_ESTIMATORS) >= {"k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k3+"}
    assert all(f"{n}+" in KL_ESTIMATORS for n in ("k1", "kl", "abs", "k2", "mse", "low_var_kl"))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


@pytest.mark.parametrize("name", KL_ESTIMATORS)
@pytest.mark.parametrize("seed", range(2))
def test_kl_estimator_value_and_gradient(name, seed):
    lp, ref = kl_inputs(seed)
    lp.requires_grad_(True)
    value = kl_penalty(lp, ref, name)
    value.sum().backward()
    grad, lp, value = lp.grad, lp.detach(), value.detach()
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            v, g = ref_kl(float(lp[i, t]), float(ref[i, t]), name)
            assert abs(float(value[i, t]) - v) <= TOL
            assert abs(float(grad[i, t]) - g) <= TOL


def test_k3_clamps_are_exercised():
    lp, ref = kl_inputs(0)
    k3 = kl_penalty(lp, ref, "k3")
    assert float(k3.max()) == 10.0  # ref - lp = 25 -> exp overflows the clamp
    assert float(k3.min()) >= 0.0


def test_fixed_controller_never_moves():
    ctrl = KLController(value=0.05)
    ctrl.update(current_kl=10.0, n_steps=512)
    assert ctrl.value == 0.05


def test_adaptive_controller_matches_reference():
    ctrl = KLController(value=0.2, adaptive=True, target_kl=0.1, horizon=1000)
    ref = 0.2
    for kl, n in [(0.3, 64), (0.05, 64), (0.1, 64), (0.11, 128), (0.0, 32)]:
        ctrl.update(kl, n)
        err = min(max(kl / 0.1 - 1.0, -0.2), 0.2)
        ref *= 1.0 + err * n / 1000
        assert abs(ctrl.value - ref) <= 1e-12
    state = ctrl.state_dict()
    other = KLController(value=1.0, adaptive=True)
    other.load_state_dict(state)
    assert other.value == ctrl.value


def test_adaptive_controller_never_goes_negative():
    # One update of 6x the horizon with KL far below target: verl's factor is
    # 1 + (-0.2) * 6 = -0.2, a negative coefficient (a reward for leaving the reference).
    ctrl = KLController(value=0.2, adaptive=True, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.0, n_steps=600)
    assert ctrl.value == 0.0
    ctrl.update(current_kl=1.0, n_steps=600)  # multiplicative: stays at 0
    assert ctrl.value == 0.0
    # Exactly 5x: the factor is 0, and below that the formula is verl's unchanged.
    ctrl = KLController(value=0.2, adaptive=True, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.0, n_steps=500)
    assert ctrl.value == 0.0
    ctrl = KLController(value=0.2, adaptive=True, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.0, n_steps=250)
    assert ctrl.value == pytest.approx(0.2 * (1 - 0.2 * 2.5), abs=1e-15)


@pytest.mark.parametrize("name", ["kl", "k3", "abs", "mse"])
def test_apply_kl_penalty_matches_reference(name):
    gen = torch.Generator().manual_seed(3)
    old, ref = kl_inputs(4)
    mask = torch.ones_like(old)
    mask[1] = 0.0  # fully masked row
    mask[2, 5:] = 0.0
    scores = torch.randn(old.shape, generator=gen, dtype=torch.float64)
    rewards, current = apply_kl_penalty(scores, old, ref, mask, coef=0.3, estimator=name)
    row_means = []
    for i in range(old.shape[0]):
        total, count = 0.0, 0.0
        for t in range(old.shape[1]):
            kl = ref_kl(float(old[i, t]), float(ref[i, t]), name)[0] * float(mask[i, t])
            expected = float(scores[i, t]) - 0.3 * kl
            assert abs(float(rewards[i, t]) - expected) <= TOL
            total += kl
            count += float(mask[i, t])
        row_means.append(total / count if count else 0.0)
    assert abs(current - sum(row_means) / len(row_means)) <= TOL
