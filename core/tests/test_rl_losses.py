"""Loss aggregation, PPO / GSPO policy losses and the value loss against float64 loop references.

Values and gradients are both checked (gradients against hand-derived per-token derivatives),
and the mini-batch normalisation is checked by splitting a batch into micro-batches of unequal
token counts: the summed gradient must equal the one-batch gradient for every mode.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlcore.interfaces import BatchTotals
from rlcore.rl.algorithm import PolicyGradientAlgorithm
from rlcore.rl.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_policy_loss_gspo,
    compute_policy_loss_vanilla,
    compute_value_loss,
    local_totals,
)

TOL = 1e-6


def cfg(**options: float) -> PolicyGradientAlgorithm.Config:
    """The algorithm Config a policy loss reads its options from."""
    return PolicyGradientAlgorithm.Config(**options)  # type: ignore[arg-type]


def random_mask(gen: torch.Generator, rows: int, length: int, holes: bool = False) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0
    lengths[1] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    if holes:
        mask = mask * (torch.rand(rows, length, generator=gen) > 0.25).double()
    return mask


def ref_weights(m: list[list[float]], mode: str, totals: BatchTotals) -> list[list[float]]:
    """d(aggregate)/d(loss[i][t]) for each mode: the loop definition of the normalisers."""
    out = []
    for row in m:
        n_i = sum(row)
        w = []
        for mt in row:
            if mt == 0:
                w.append(0.0)
            elif mode == "token-mean":
                w.append(1.0 / max(totals.tokens, 1))
            elif mode == "token-sum":
                w.append(1.0)
            elif mode == "seq-mean-token-sum":
                w.append(1.0 / totals.sequences)
            elif mode == "seq-mean-token-mean":
                w.append(1.0 / (n_i * totals.sequences))
            else:  # seq-mean-token-sum-norm
                w.append(1.0 / (totals.max_response_length * totals.sequences))
        out.append(w)
    return out


def ref_agg(loss: list[list[float]], m: list[list[float]], mode: str, totals: BatchTotals) -> float:
    w = ref_weights(m, mode, totals)
    return sum(loss[i][t] * w[i][t] for i in range(len(loss)) for t in range(len(loss[i])))


def ref_masked_mean(x, m) -> float:
    num = sum(x[i][t] * m[i][t] for i in range(len(x)) for t in range(len(x[i])))
    den = sum(sum(row) for row in m)
    return num / den if den else 0.0


def tensor(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def inputs(seed: int, rows: int = 10, length: int = 12, holes: bool = False):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, rows, length, holes)
    old = -torch.rand(rows, length, generator=gen, dtype=torch.float64) * 3
    # log-ratios from -1 to 1: plenty of clipped tokens on both sides, a few beyond ±20
    new = old + (torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2 - 1)
    new[:, 0] = old[:, 0] + 1.6  # ratio ~5 > clip_ratio_c: dual-clip where A < 0
    new[2, :3] = old[2, :3] + torch.tensor([25.0, -25.0, 0.0], dtype=torch.float64)
    adv = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    adv[3] = 0.0  # ties in the objective
    return mask, old, new, adv


# --- aggregation ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_agg_loss_matches_reference(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 8, 10, holes=bool(seed % 2))
    loss = torch.randn(8, 10, generator=gen, dtype=torch.float64)
    m = mask.tolist()
    local = BatchTotals(tokens=int(mask.sum()), sequences=8, max_response_length=10)
    assert abs(float(agg_loss(loss, mask, mode)) - ref_agg(loss.tolist(), m, mode, local)) <= TOL
    glob = BatchTotals(tokens=123, sequences=29, max_response_length=16)
    value = float(agg_loss(loss, mask, mode, glob))
    assert abs(value - ref_agg(loss.tolist(), m, mode, glob)) <= TOL


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_fully_masked_is_zero_with_graph(mode):
    loss = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = agg_loss(loss, torch.zeros(3, 4), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(3, 4, dtype=torch.float64))


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'token-total'"):
        agg_loss(torch.zeros(2, 2), torch.ones(2, 2), "token-total")


# --- PPO clipped policy loss ------------------------------------------------------------------


def ref_vanilla(old, new, adv, m, lo, hi, c, mode, totals):
    """Loss, d loss / d new, and the three metrics, token by token."""
    rows, length = len(old), len(old[0])
    loss_mat = [[0.0] * length for _ in range(rows)]
    dmat = [[0.0] * length for _ in range(rows)]
    clip = [[0.0] * length for _ in range(rows)]
    lower = [[0.0] * length for _ in range(rows)]
    kl = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        for t in range(length):
            raw = new[i][t] - old[i][t]
            lr = min(max(raw, -20.0), 20.0)
            ratio = math.exp(lr)
            a = adv[i][t]
            l1 = -a * ratio
            l2 = -a * min(max(ratio, 1 - lo), 1 + hi)
            clipped = max(l1, l2)
            # gradient of the active branch: the unclipped one (unless the clamp of the
            # log-ratio is active) or a constant
            d = -a * ratio if (l1 >= l2 and -20.0 < raw < 20.0) else 0.0
            value = clipped
            if a < 0:
                l3 = -a * c
                if clipped > l3:
                    value, d = l3, 0.0
                    lower[i][t] = 1.0
            loss_mat[i][t] = value
            dmat[i][t] = d
            clip[i][t] = 1.0 if l2 > l1 else 0.0
            kl[i][t] = -lr
    w = ref_weights(m, mode, totals)
    grad = [[dmat[i][t] * w[i][t] for t in range(length)] for i in range(rows)]
    metrics = (ref_masked_mean(clip, m), ref_masked_mean(kl, m), ref_masked_mean(lower, m))
    return ref_agg(loss_mat, m, mode, totals), grad, metrics


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize(
    ("seed", "lo", "hi", "c"), [(0, 0.2, 0.2, 3.0), (1, 0.2, 0.28, 3.0), (2, 0.1, 0.3, 1.5)]
)
def test_vanilla_policy_loss_matches_reference(mode, seed, lo, hi, c):
    mask, old, new, adv = inputs(seed, holes=seed == 1)
    new.requires_grad_(True)
    totals = BatchTotals(tokens=int(mask.sum()) + 7, sequences=13, max_response_length=15)
    loss, metrics = compute_policy_loss_vanilla(
        old, new, adv, mask, loss_agg_mode=mode,
        config=cfg(clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c), totals=totals,
    )  # fmt: skip
    clipfrac, ppo_kl = metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"]
    lower = metrics["actor/pg_clipfrac_lower"]
    loss.backward()
    ref_loss, ref_grad, (ref_clip, ref_kl, ref_lower) = ref_vanilla(
        old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), lo, hi, c, mode, totals
    )
    assert abs(loss.item() - ref_loss) <= TOL
    assert float((new.grad - tensor(ref_grad)).abs().max()) <= TOL
    assert abs(float(clipfrac) - ref_clip) <= TOL
    assert abs(float(ppo_kl) - ref_kl) <= TOL
    assert abs(float(lower) - ref_lower) <= TOL
    assert 0 < ref_clip < 1  # the inputs exercise both clips
    assert ref_lower > 0


def test_dual_clip_needs_c_above_one():
    mask, old, new, adv = inputs(0)
    # A Config refuses c <= 1 itself; the loss checks too (any object with the options).
    options = SimpleNamespace(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match=r"clip_ratio_c must be > 1\.0"):
        compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode="token-mean", config=options)


# --- GSPO -------------------------------------------------------------------------------------


def ref_gspo(old, new, adv, m, lo, hi, mode, totals):
    rows, length = len(old), len(old[0])
    loss_mat = [[0.0] * length for _ in range(rows)]
    dmat = [[0.0] * length for _ in range(rows)]
    clip = [[0.0] * length for _ in range(rows)]
    kl = [[new[i][t] - old[i][t] for t in range(length)] for i in range(rows)]
    for i in range(rows):
        n_i = max(sum(m[i]), 1.0)
        seq = sum((new[i][t] - old[i][t]) * m[i][t] for t in range(length)) / n_i
        s = math.exp(min(seq, 10.0))
        for t in range(length):
            a = adv[i][t]
            l1 = -a * s
            l2 = -a * min(max(s, 1 - lo), 1 + hi)
            loss_mat[i][t] = max(l1, l2)
            # d s_t / d new_t = s (value sg[s_i], gradient through this token's log-prob)
            dmat[i][t] = -a * s if (l1 >= l2 and seq < 10.0) else 0.0
            clip[i][t] = 1.0 if l2 > l1 else 0.0
    w = ref_weights(m, mode, totals)
    grad = [[dmat[i][t] * w[i][t] for t in range(length)] for i in range(rows)]
    neg_kl = [[-x for x in row] for row in kl]
    return (
        ref_agg(loss_mat, m, mode, totals),
        grad,
        ref_masked_mean(clip, m),
        ref_masked_mean(neg_kl, m),
    )


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_gspo_policy_loss_matches_reference(mode, seed):
    mask, old, new, adv = inputs(10 + seed, holes=seed == 1)
    new = old + (new - old) * 0.3  # sequence ratios on both sides of the clip range
    new[4, :] = old[4, :] + 12.0  # a sequence whose log-ratio is clamped at 10
    new.requires_grad_(True)
    totals = local_totals(mask)
    loss, metrics = compute_policy_loss_gspo(
        old, new, adv, mask, loss_agg_mode=mode,
        config=cfg(clip_ratio_low=0.1, clip_ratio_high=0.12), totals=totals,
    )  # fmt: skip
    clipfrac, ppo_kl = metrics["actor/pg_clipfrac"], metrics["actor/ppo_kl"]
    lower = metrics["actor/pg_clipfrac_lower"]
    loss.backward()
    ref_loss, ref_grad, ref_clip, ref_kl = ref_gspo(
        old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), 0.1, 0.12, mode, totals
    )
    assert abs(loss.item() - ref_loss) <= TOL
    assert float((new.grad - tensor(ref_grad)).abs().max()) <= TOL
    assert abs(float(clipfrac) - ref_clip) <= TOL
    assert abs(float(ppo_kl) - ref_kl) <= TOL
    assert float(lower) == 0.0
    assert 0 < ref_clip < 1


# --- value loss -------------------------------------------------------------------------------


def ref_value(v, ret, old, m, c, mode, totals):
    rows, length = len(v), len(v[0])
    loss_mat = [[0.0] * length for _ in range(rows)]
    dmat = [[0.0] * length for _ in range(rows)]
    clip = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        for t in range(length):
            vc = min(max(v[i][t], old[i][t] - c), old[i][t] + c)
            l1 = (v[i][t] - ret[i][t]) ** 2
            l2 = (vc - ret[i][t]) ** 2
            loss_mat[i][t] = 0.5 * max(l1, l2)
            dmat[i][t] = (v[i][t] - ret[i][t]) if l1 >= l2 else 0.0
            clip[i][t] = 1.0 if l2 > l1 else 0.0
    w = ref_weights(m, mode, totals)
    grad = [[dmat[i][t] * w[i][t] for t in range(length)] for i in range(rows)]
    return ref_agg(loss_mat, m, mode, totals), grad, ref_masked_mean(clip, m)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_value_loss_matches_reference(mode, seed):
    gen = torch.Generator().manual_seed(50 + seed)
    mask = random_mask(gen, 9, 11, holes=seed == 2)
    old = torch.randn(9, 11, generator=gen, dtype=torch.float64)
    ret = torch.randn(9, 11, generator=gen, dtype=torch.float64)
    v = (old + torch.randn(9, 11, generator=gen, dtype=torch.float64)).requires_grad_(True)
    totals = BatchTotals(tokens=int(mask.sum()) + 3, sequences=11, max_response_length=11)
    loss, clipfrac = compute_value_loss(
        v, ret, old, mask, cliprange_value=0.5, loss_agg_mode=mode, totals=totals
    )
    loss.backward()
    ref_loss, ref_grad, ref_clip = ref_value(
        v.tolist(), ret.tolist(), old.tolist(), mask.tolist(), 0.5, mode, totals
    )
    assert abs(loss.item() - ref_loss) <= TOL
    assert float((v.grad - tensor(ref_grad)).abs().max()) <= TOL
    assert abs(float(clipfrac) - ref_clip) <= TOL
    assert 0 < ref_clip < 1


# --- the gradient does not depend on how the mini-batch is split ------------------------------


def _grad_of_split(fn, new: torch.Tensor, splits: list[list[int]], totals: BatchTotals | None):
    leaf = new.detach().clone().requires_grad_(True)
    for rows in splits:
        idx = torch.tensor(rows)
        loss = fn(leaf[idx], idx, totals)
        loss.backward()
    assert leaf.grad is not None
    return leaf.grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("loss_name", ["vanilla", "gspo", "value"])
def test_micro_batch_split_gives_the_same_gradient(mode, loss_name):
    mask, old, new, adv = inputs(77, rows=12, length=16, holes=True)
    # Two "data-parallel ranks", each with micro-batches of unequal row and token counts.
    splits = [[0, 5, 9], [1, 2], [3, 4, 6, 7, 8], [10], [11]]
    tokens = [int(mask[r].sum()) for r in splits]
    assert len(set(tokens)) == len(tokens)  # unequal token counts

    def fn(x: torch.Tensor, idx: torch.Tensor, totals: BatchTotals | None) -> torch.Tensor:
        m = mask[idx]
        if loss_name == "vanilla":
            return compute_policy_loss_vanilla(
                old[idx], x, adv[idx], m, loss_agg_mode=mode, config=cfg(), totals=totals
            )[0]
        if loss_name == "gspo":
            return compute_policy_loss_gspo(
                old[idx], x, adv[idx], m, loss_agg_mode=mode, config=cfg(), totals=totals
            )[0]
        return compute_value_loss(
            x, adv[idx], old[idx], m, cliprange_value=0.2, loss_agg_mode=mode, totals=totals
        )[0]

    whole = _grad_of_split(fn, new, [list(range(12))], local_totals(mask))
    split = _grad_of_split(fn, new, splits, local_totals(mask))
    assert float((whole - split).abs().max()) <= 1e-12
    assert float(whole.abs().max()) > 0
    # Averaging losses normalised by each micro-batch's own counts (gradient accumulation
    # without global totals) gives another gradient: the check above can fail.
    naive = _grad_of_split(fn, new, splits, None) / len(splits)
    assert float((whole - naive).abs().max()) > 1e-6
