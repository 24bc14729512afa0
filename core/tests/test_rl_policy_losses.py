"""CISPO, GPG, SAPO, GMPO, KL-Cov and rollout importance weights against loop references in float64.

Each reference is the paper's formula written token by token in plain Python (value and the
gradient with respect to the new log-probs); where verl has the loss, its formula is the same
and the docstring of the reference says where it differs. Tolerance 1e-6 (float64 agrees to
~1e-12). Also: NaN/inf at padded positions never reach a loss, for every aggregation mode.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.interfaces import BatchTotals
from rlcore.rl.advantages import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from rlcore.rl.algorithm import PolicyGradientAlgorithm
from rlcore.rl.kl import apply_kl_penalty
from rlcore.rl.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_gmpo,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    compute_value_loss,
)
from rlcore.rl.masked import masked_mean, masked_sum, masked_var, masked_whiten
from rlcore.rl.rollout_is import rollout_is_weights

TOL = 1e-6


def random_mask(gen: torch.Generator, rows: int, length: int, holes: bool) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0
    lengths[1] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    if holes:
        mask = mask * (torch.rand(rows, length, generator=gen) > 0.25).double()
    return mask


def inputs(seed: int, rows: int = 10, length: int = 12, holes: bool = False):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, rows, length, holes)
    old = -torch.rand(rows, length, generator=gen, dtype=torch.float64) * 3
    new = old + (torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2 - 1)
    new[2, :3] = old[2, :3] + torch.tensor([25.0, -25.0, 0.0], dtype=torch.float64)
    adv = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    adv[3] = 0.0
    rollout = old + 0.3 * torch.randn(rows, length, generator=gen, dtype=torch.float64)
    return mask, old, new, adv, rollout


def weights_of(m, mode: str, totals: BatchTotals):
    """d(aggregate)/d(token loss), the loop definition of each mode's normaliser."""
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
            else:
                w.append(1.0 / (totals.max_response_length * totals.sequences))
        out.append(w)
    return out


def aggregate(loss_mat, dmat, m, mode, totals):
    w = weights_of(m, mode, totals)
    rows, length = len(m), len(m[0])
    value = sum(loss_mat[i][t] * w[i][t] for i in range(rows) for t in range(length))
    grad = [[dmat[i][t] * w[i][t] for t in range(length)] for i in range(rows)]
    return value, grad


def call(
    fn, old, new, adv, mask, *, loss_agg_mode="token-mean", totals=None, rollout_is_weights=None,
    **options,
):  # fmt: skip
    """``fn`` through the registry's one signature, its options (the algorithm Config's
    fields) as keywords: ``(loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``."""
    config = PolicyGradientAlgorithm.Config(**options)
    loss, metrics = fn(
        old, new, adv, mask, loss_agg_mode=loss_agg_mode, config=config, totals=totals,
        rollout_is_weights=rollout_is_weights,
    )  # fmt: skip
    keys = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
    return (loss, *(metrics[k] for k in keys))


def run(fn, new, *args, **kw):
    leaf = new.detach().clone().requires_grad_(True)
    out = call(fn, *args[:1], leaf, *args[1:], **kw)
    out[0].backward()
    return out, leaf.grad


def close(x, ref) -> bool:
    return float((torch.as_tensor(x, dtype=torch.float64) - torch.tensor(ref)).abs().max()) <= TOL


TOTALS = BatchTotals(tokens=97, sequences=23, max_response_length=16)


# --- CISPO ------------------------------------------------------------------------------------


def ref_cispo(old, new, adv, m, lo, hi, iw):
    """MiniMax-M1 eq. (4): J = sg(clip(r, 1 - lo, 1 + hi)) * A * log pi; L = -J per token."""
    rows, length = len(old), len(old[0])
    loss = [[0.0] * length for _ in range(rows)]
    grad = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        for t in range(length):
            r = math.exp(min(max(new[i][t] - old[i][t], -20.0), 20.0))
            w = min(max(r, 1 - lo), 1 + hi) * iw[i][t]
            loss[i][t] = -w * adv[i][t] * new[i][t]
            grad[i][t] = -w * adv[i][t]
    return loss, grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", range(2))
def test_cispo_matches_reference(mode, seed):
    mask, old, new, adv, _ = inputs(seed, holes=bool(seed))
    ones = [[1.0] * 12 for _ in range(10)]
    (loss, clipfrac, _, _), grad = run(
        compute_policy_loss_cispo, new, old, adv, mask,
        clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode, totals=TOTALS,
    )  # fmt: skip
    lm, dm = ref_cispo(old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, ones)
    value, ref_grad = aggregate(lm, dm, mask.tolist(), mode, TOTALS)
    assert abs(loss.item() - value) <= TOL
    assert close(grad, ref_grad)
    # CISPO keeps a gradient on every valid token with A != 0, clipped or not.
    valid = (mask > 0) & (adv != 0)
    assert bool((grad[valid] != 0).all())
    assert 0.0 < float(clipfrac) < 1.0


# --- GPG --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_gpg_matches_reference(mode):
    mask, old, new, adv, _ = inputs(5, holes=True)
    (loss, *_), grad = run(
        compute_policy_loss_gpg, new, old, adv, mask, loss_agg_mode=mode, totals=TOTALS
    )
    lm = [[-a * x for a, x in zip(ra, rx)] for ra, rx in zip(adv.tolist(), new.tolist())]
    dm = [[-a for a in ra] for ra in adv.tolist()]
    value, ref_grad = aggregate(lm, dm, mask.tolist(), mode, TOTALS)
    assert abs(loss.item() - value) <= TOL
    assert close(grad, ref_grad)


# --- SAPO -------------------------------------------------------------------------------------


def ref_sapo(old, new, adv, tau_pos, tau_neg):
    """SAPO: f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau by the sign of A; L = -f(r) A."""
    rows, length = len(old), len(old[0])
    loss = [[0.0] * length for _ in range(rows)]
    grad = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        for t in range(length):
            raw = new[i][t] - old[i][t]
            r = math.exp(min(max(raw, -20.0), 20.0))
            tau = tau_pos if adv[i][t] > 0 else tau_neg
            sig = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
            loss[i][t] = -sig * 4.0 / tau * adv[i][t]
            # d/dnew: -A * 4/tau * sig(1-sig) * tau * r (r = exp(new - old))
            inside = -20.0 < raw < 20.0
            grad[i][t] = -adv[i][t] * 4.0 * sig * (1.0 - sig) * r if inside else 0.0
    return loss, grad


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_sapo_matches_reference(mode):
    mask, old, new, adv, _ = inputs(7, holes=True)
    (loss, *_), grad = run(
        compute_policy_loss_sapo, new, old, adv, mask,
        sapo_tau_pos=1.0, sapo_tau_neg=1.05, loss_agg_mode=mode, totals=TOTALS,
    )  # fmt: skip
    lm, dm = ref_sapo(old.tolist(), new.tolist(), adv.tolist(), 1.0, 1.05)
    value, ref_grad = aggregate(lm, dm, mask.tolist(), mode, TOTALS)
    assert abs(loss.item() - value) <= TOL
    assert close(grad, ref_grad)


def test_sapo_on_policy_is_the_plain_policy_gradient():
    # f'(1) = 1: at r = 1 the gradient is -A * d r / d new = -A.
    mask, old, _, adv, _ = inputs(8)
    (_, *_), grad = run(
        compute_policy_loss_sapo, old, old, adv, mask, loss_agg_mode="token-sum", totals=TOTALS
    )
    assert close(grad, (-adv * mask).tolist())


# --- GMPO -------------------------------------------------------------------------------------


def ref_gmpo(old, new, adv, m, lo, hi, iw, totals):
    """GMPO eq.: per row -mean(A) * exp(mean_t sgn(A) min(sgn(A) d, sgn(A) clip(d))), summed
    over rows / totals.sequences (verl: mean over the rows of the micro-batch)."""
    rows, length = len(old), len(old[0])
    value = 0.0
    grad = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        valid = [t for t in range(length) if m[i][t] != 0]
        if not valid:
            continue
        n = len(valid)
        terms, active = [], []
        for t in valid:
            d = new[i][t] - old[i][t]
            s = (adv[i][t] > 0) - (adv[i][t] < 0)
            c = min(max(d, -lo), hi)
            if s * d <= s * c:  # the unclipped log-ratio is the pessimistic one: gradient 1
                terms.append(d)
                active.append(1.0 if s != 0 else 0.0)
            else:
                terms.append(c)
                active.append(0.0)
            if s == 0:
                terms[-1] = 0.0
        ratio = math.exp(sum(terms) / n)
        mean_adv = sum(adv[i][t] for t in valid) / n
        seq_w = math.exp(sum(math.log(iw[i][t] + 1e-10) for t in valid) / n)
        value += -mean_adv * ratio * seq_w
        for k, t in enumerate(valid):
            grad[i][t] = -mean_adv * ratio * seq_w * active[k] / n / totals.sequences
    return value / totals.sequences, grad


@pytest.mark.parametrize("with_is", [False, True])
def test_gmpo_matches_reference(with_is):
    mask, old, new, adv, rollout = inputs(9, holes=True)
    weights = rollout_is_weights(old, rollout, mask, level="token", cap=2.0) if with_is else None
    iw = weights.tolist() if with_is else [[1.0] * 12 for _ in range(10)]
    (loss, *_), grad = run(
        compute_policy_loss_gmpo, new, old, adv, mask,
        clip_ratio_low=0.4, clip_ratio_high=0.4, totals=TOTALS, rollout_is_weights=weights,
    )  # fmt: skip
    value, ref_grad = ref_gmpo(
        old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), 0.4, 0.4, iw, TOTALS
    )
    assert abs(loss.item() - value) <= TOL
    assert close(grad, ref_grad)


def test_gmpo_with_sequence_advantages_equals_verl_mean_over_rows():
    # verl's geo_mean returns torch.mean over the rows; with totals = this micro-batch, equal.
    mask, old, new, _, _ = inputs(10)
    adv = torch.randn(10, 1, dtype=torch.float64).expand(10, 12).contiguous()
    mask[0] = 1.0  # verl divides by (length + 1e-8): keep every row non-empty
    clip = {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}
    loss = call(compute_policy_loss_gmpo, old, new, adv, mask, **clip)[0]
    d = new - old
    s = torch.sign(adv)
    c = s * torch.minimum(s * d, s * d.clamp(-0.4, 0.4))
    n = mask.sum(-1)
    verl = (-(adv * mask).sum(-1) / (n + 1e-8) * torch.exp((c * mask).sum(-1) / (n + 1e-8))).mean()
    assert abs(float(loss) - float(verl)) <= TOL


# --- KL-Cov ----------------------------------------------------------------------------------


def ref_kl_cov(old, new, adv, m, ratio_k, coef):
    """KL-Cov: -A r per token, plus coef * |log r| on the top-k covariance tokens."""
    rows, length = len(old), len(old[0])
    valid = [(i, t) for i in range(rows) for t in range(length) if m[i][t] != 0]
    mean_a = sum(adv[i][t] for i, t in valid) / len(valid)
    mean_l = sum(new[i][t] for i, t in valid) / len(valid)
    cov = {(i, t): (adv[i][t] - mean_a) * (new[i][t] - mean_l) for i, t in valid}
    k = max(1, int(len(valid) * ratio_k))
    top = set(sorted(cov, key=cov.__getitem__, reverse=True)[:k])
    loss = [[0.0] * length for _ in range(rows)]
    grad = [[0.0] * length for _ in range(rows)]
    for i, t in valid:
        d = new[i][t] - old[i][t]
        r = math.exp(d)
        loss[i][t] = -adv[i][t] * r
        grad[i][t] = -adv[i][t] * r
        if (i, t) in top:
            loss[i][t] += coef * abs(d)
            grad[i][t] += coef * (1.0 if d > 0 else -1.0 if d < 0 else 0.0)
    return loss, grad, top


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_kl_cov_matches_reference_and_verl(mode):
    mask, old, new, adv, _ = inputs(15, rows=16, length=20, holes=True)
    new[2, :3] = old[2, :3]  # no +-25 log-ratios here: r = exp(d) unclamped, as verl
    (loss, *_), grad = run(
        compute_policy_loss_kl_cov, new, old, adv, mask,
        kl_cov_ratio=0.05, ppo_kl_coef=0.7, loss_agg_mode=mode, totals=TOTALS,
    )  # fmt: skip
    lm, dm, top = ref_kl_cov(old.tolist(), new.tolist(), adv.tolist(), mask.tolist(), 0.05, 0.7)
    assert len(top) == int(int(mask.sum()) * 0.05) > 1
    value, ref_grad = aggregate(lm, dm, mask.tolist(), mode, TOTALS)
    assert abs(loss.item() - value) <= TOL
    assert close(grad, ref_grad)
    # verl's formulation: top-k over the flattened valid tokens, indices mapped back.
    valid = mask > 0
    idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    a, lp = adv[valid], new[valid]
    cov = (a - a.mean()) * (lp - lp.mean())
    large = idx[torch.topk(cov, max(1, int(len(cov) * 0.05))).indices]
    pg = -adv * torch.exp(new - old)
    pg_kl = pg + 0.7 * (new - old).abs()
    rows, cols = large // 20, large % 20
    pg[rows, cols] = pg_kl[rows, cols]
    verl = agg_loss(pg, mask, mode, TOTALS)
    assert abs(loss.item() - float(verl)) <= TOL


# --- rollout importance weights ---------------------------------------------------------------


def ref_is(old, rollout, m, level, cap):
    rows, length = len(old), len(old[0])
    out = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        seq = sum(old[i][t] - rollout[i][t] for t in range(length) if m[i][t] != 0)
        for t in range(length):
            if m[i][t] == 0:
                continue
            lr = old[i][t] - rollout[i][t] if level == "token" else seq
            out[i][t] = min(math.exp(min(max(lr, -20.0), 20.0)), cap)
    return out


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_is_weights_match_reference(level):
    mask, old, _, _, rollout = inputs(11, holes=True)
    rollout[4, 2] = float("nan")  # NaN where the mask is 0 below must not matter
    mask[4, 2] = 0.0
    w = rollout_is_weights(old, rollout, mask, level=level, cap=1.5)
    assert not w.requires_grad
    assert close(w, ref_is(old.tolist(), rollout.tolist(), mask.tolist(), level, 1.5))
    assert float(w.max()) <= 1.5
    assert float(w.max()) == 1.5  # some are truncated


@pytest.mark.parametrize(
    "fn", [compute_policy_loss_vanilla, compute_policy_loss_gspo, compute_policy_loss_cispo,
           compute_policy_loss_gpg, compute_policy_loss_sapo, compute_policy_loss_kl_cov],
)  # fmt: skip
def test_rollout_is_weights_multiply_each_token_loss(fn):
    mask, old, new, adv, rollout = inputs(12, holes=True)
    new[2, :3] = old[2, :3]  # kl_cov does not clamp log r: keep gradients O(1) here
    w = rollout_is_weights(old, rollout, mask, level="token", cap=2.0)
    (weighted, *_), grad_w = run(
        fn, new, old, adv, mask, loss_agg_mode="token-sum", rollout_is_weights=w
    )
    # The same as weighting by hand: d(sum w_t * L_t)/d new_t = w_t * dL_t/d new_t for the
    # token losses (GSPO's sequence ratio couples tokens, so only its value is checked).
    leaf = new.detach().clone().requires_grad_(True)
    plain = call(fn, old, leaf, adv, mask, loss_agg_mode="token-sum")[0]
    assert weighted.item() != pytest.approx(plain.item())
    if fn is not compute_policy_loss_gspo:
        per_token = torch.autograd.grad(plain, leaf)[0]
        assert close(grad_w, (w * per_token).tolist())


# --- NaN / inf at padding ---------------------------------------------------------------------


def _poison(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    return torch.where(mask == 0, torch.full_like(x, value), x)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_at_padding_never_reaches_the_loss(mode, bad):
    mask, old, new, adv, rollout = inputs(13, holes=True)
    # Every input poisoned where the mask is 0; the results equal the clean ones.
    p_old, p_new, p_adv, p_rollout = (_poison(x, mask, bad) for x in (old, new, adv, rollout))
    clean_agg = agg_loss(new, mask, mode, TOTALS)
    assert torch.equal(agg_loss(p_new, mask, mode, TOTALS), clean_agg)
    w_clean = rollout_is_weights(old, rollout, mask, level="sequence", cap=2.0)
    w_bad = rollout_is_weights(p_old, p_rollout, mask, level="sequence", cap=2.0)
    assert torch.equal(w_bad, w_clean)
    for fn, kw in [
        (compute_policy_loss_vanilla, {"loss_agg_mode": mode}),
        (compute_policy_loss_gspo, {"loss_agg_mode": mode}),
        (compute_policy_loss_cispo, {"loss_agg_mode": mode}),
        (compute_policy_loss_gpg, {"loss_agg_mode": mode}),
        (compute_policy_loss_sapo, {"loss_agg_mode": mode}),
        (compute_policy_loss_gmpo, {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}),
        (compute_policy_loss_kl_cov, {"loss_agg_mode": mode, "kl_cov_ratio": 0.1}),
    ]:
        leaf = p_new.detach().clone().requires_grad_(True)
        out = call(fn, p_old, leaf, p_adv, mask, totals=TOTALS, rollout_is_weights=w_bad, **kw)
        ref = call(fn, old, new, adv, mask, totals=TOTALS, rollout_is_weights=w_clean, **kw)
        for got, want in zip([out[0].detach(), *out[1:]], [ref[0].detach(), *ref[1:]]):
            assert math.isfinite(float(got)), fn.__name__
            assert abs(float(got) - float(want)) <= 1e-12, fn.__name__
        out[0].backward()
        assert torch.isfinite(leaf.grad).all(), fn.__name__
        assert bool((leaf.grad[mask == 0] == 0).all()), fn.__name__
    value = compute_value_loss(
        p_new, p_adv, p_old, mask, cliprange_value=0.2, loss_agg_mode=mode, totals=TOTALS
    )
    clean = compute_value_loss(
        new, adv, old, mask, cliprange_value=0.2, loss_agg_mode=mode, totals=TOTALS
    )
    assert abs(float(value[0]) - float(clean[0])) <= 1e-12


def test_nan_at_padding_in_masked_ops_advantages_and_kl():
    mask, old, new, adv, _ = inputs(14, holes=True)
    bad = _poison(new, mask, float("nan"))
    for op in (masked_mean, masked_sum):
        assert torch.equal(op(bad, mask), op(new, mask))
        assert torch.equal(op(bad, mask, dim=-1), op(new, mask, dim=-1))
    assert torch.equal(masked_var(bad, mask), masked_var(new, mask))
    assert torch.equal(masked_whiten(bad, mask)[mask > 0], masked_whiten(new, mask)[mask > 0])
    uids = [i // 2 for i in range(10)]
    r, pr = adv, _poison(adv, mask, float("nan"))
    v, pv = old, _poison(old, mask, float("nan"))
    pairs = [
        (compute_gae_advantage_return(pr, pv, mask, 1.0, 0.95),
         compute_gae_advantage_return(r, v, mask, 1.0, 0.95)),
        (compute_grpo_outcome_advantage(r * mask, mask, uids),
         compute_grpo_outcome_advantage(r * mask, mask, uids)),
        (compute_rloo_outcome_advantage(r * mask, mask, uids),
         compute_rloo_outcome_advantage(r * mask, mask, uids)),
        (compute_reinforce_plus_plus_outcome_advantage(pr, mask),
         compute_reinforce_plus_plus_outcome_advantage(r, mask)),
        (compute_reinforce_plus_plus_baseline_outcome_advantage(r * mask, mask, uids),
         compute_reinforce_plus_plus_baseline_outcome_advantage(r * mask, mask, uids)),
    ]  # fmt: skip
    for got, want in pairs:
        for g, w in zip(got, want):
            assert torch.isfinite(g).all()
            assert float((g - w).abs().max()) <= 1e-12
    rewards, kl = apply_kl_penalty(
        adv * mask, _poison(old, mask, float("nan")), _poison(new, mask, float("inf")), mask,
        coef=0.1, estimator="k3",
    )  # fmt: skip
    clean, clean_kl = apply_kl_penalty(adv * mask, old, new, mask, coef=0.1, estimator="k3")
    assert torch.equal(rewards, clean)
    assert kl == clean_kl
