"""Advantage estimators against float64 references written as plain Python loops.

Inputs are random, with random masks (right-padded lengths including fully masked and full
rows, and masks with holes), groups of one, ties and zero-variance groups, and uids that
arrive shuffled (not contiguous).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlcore.rl.advantages import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    group_index,
)
from rlcore.rl.masked import masked_mean, masked_var, masked_whiten

TOL = 1e-6


# --- random inputs ----------------------------------------------------------------------------


def random_mask(gen: torch.Generator, rows: int, length: int, holes: bool) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (rows,), generator=gen)
    lengths[0] = 0  # a fully masked row
    lengths[1] = length  # a full row
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    if holes:  # multi-turn style: tool tokens inside the response are masked out
        mask = mask * (torch.rand(rows, length, generator=gen) > 0.25).double()
    return mask


def random_groups(gen: torch.Generator, rows: int) -> np.ndarray:
    """uids with groups of sizes 1..5, shuffled so that a group's rows are not contiguous."""
    uids: list[str] = []
    g = 0
    while len(uids) < rows:
        size = int(torch.randint(1, 6, (1,), generator=gen))
        uids.extend([f"prompt-{g}"] * size)
        g += 1
    uids = uids[:rows]
    perm = torch.randperm(rows, generator=gen).tolist()
    return np.array([uids[i] for i in perm], dtype=object)


def outcome_rewards(gen: torch.Generator, mask: torch.Tensor, uids: np.ndarray) -> torch.Tensor:
    """Scores from {0, 0.5, 1} (ties, zero-variance groups) placed on the last valid token,
    plus one group whose scores are all 0.1 (not representable: rounding must cancel)."""
    rows, length = mask.shape
    rewards = torch.zeros(rows, length, dtype=torch.float64)
    choices = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    first = uids[0]
    for i in range(rows):
        score = (
            0.1 if uids[i] == first else float(choices[torch.randint(0, 3, (1,), generator=gen)])
        )
        valid = mask[i].nonzero()
        pos = int(valid[-1]) if len(valid) else length - 1
        rewards[i, pos] = score
    return rewards


def to_lists(t: torch.Tensor) -> list[list[float]]:
    return t.double().tolist()


def max_diff(a: torch.Tensor, ref: list[list[float]]) -> float:
    return float((a.double() - torch.tensor(ref, dtype=torch.float64)).abs().max())


# --- references -------------------------------------------------------------------------------


def ref_whiten(x: list[list[float]], m: list[list[float]]) -> list[list[float]]:
    vals = [x[i][t] for i in range(len(x)) for t in range(len(x[i])) if m[i][t] > 0]
    n = len(vals)
    mean = sum(vals) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
    inv = 1.0 / math.sqrt(var + 1e-8)
    return [[(x[i][t] - mean) * inv * m[i][t] for t in range(len(x[i]))] for i in range(len(x))]


def ref_gae(r, v, m, gamma, lam):
    rows, length = len(r), len(r[0])
    adv = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        next_value, last = 0.0, 0.0
        for t in range(length - 1, -1, -1):
            delta = r[i][t] + gamma * next_value - v[i][t]
            gae = delta + gamma * lam * last
            if m[i][t] > 0:
                next_value, last = v[i][t], gae
            adv[i][t] = last
    returns = [[(adv[i][t] + v[i][t]) * m[i][t] for t in range(length)] for i in range(rows)]
    return ref_whiten(adv, m), returns


def ref_scores(r):
    return [sum(row) for row in r]


def ref_groups(uids):
    groups: dict[object, list[int]] = {}
    for i, u in enumerate(uids):
        groups.setdefault(u, []).append(i)
    return groups


def ref_grpo(r, m, uids, eps, norm):
    s = ref_scores(r)
    adv = [0.0] * len(s)
    for rows in ref_groups(uids).values():
        n = len(rows)
        if n == 1:
            continue  # a group of one: advantage 0
        mean = sum(s[i] for i in rows) / n
        std = math.sqrt(sum((s[i] - mean) ** 2 for i in rows) / (n - 1))
        for i in rows:
            adv[i] = (s[i] - mean) / (std + eps) if norm else s[i] - mean
    return [[adv[i] * m[i][t] for t in range(len(m[i]))] for i in range(len(s))]


def ref_rloo(r, m, uids):
    s = ref_scores(r)
    adv = [0.0] * len(s)
    for rows in ref_groups(uids).values():
        for i in rows:
            others = [s[j] for j in rows if j != i]
            adv[i] = s[i] - sum(others) / len(others) if others else 0.0
    return [[adv[i] * m[i][t] for t in range(len(m[i]))] for i in range(len(s))]


def ref_rpp(r, m, gamma):
    """G_t over the valid tokens only: masked tokens are not steps, the return carries."""
    rows, length = len(r), len(r[0])
    returns = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        running = 0.0
        for t in range(length - 1, -1, -1):
            if m[i][t] != 0:
                running = r[i][t] + gamma * running
                returns[i][t] = running
    return ref_whiten(returns, m), returns


def ref_rpp_verl(r, m, gamma):
    """verl's recursion: add r_t everywhere, reset the running return at masked tokens."""
    rows, length = len(r), len(r[0])
    returns = [[0.0] * length for _ in range(rows)]
    for i in range(rows):
        running = 0.0
        for t in range(length - 1, -1, -1):
            running = r[i][t] + gamma * running
            returns[i][t] = running
            if m[i][t] == 0:
                running = 0.0
    masked = [[returns[i][t] * m[i][t] for t in range(length)] for i in range(rows)]
    return ref_whiten(returns, m), masked


def ref_rpp_baseline(r, m, uids):
    s = ref_scores(r)
    centered = [0.0] * len(s)
    for rows in ref_groups(uids).values():
        mean = sum(s[i] for i in rows) / len(rows)
        for i in rows:
            centered[i] = s[i] - mean
    x = [[centered[i] * m[i][t] for t in range(len(m[i]))] for i in range(len(s))]
    return ref_whiten(x, m)


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("holes", [False, True])
def test_masked_ops_match_reference(seed, holes):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 9, 11, holes)
    x = torch.randn(9, 11, generator=gen, dtype=torch.float64)
    xs, ms = to_lists(x), to_lists(mask)
    vals = [xs[i][t] for i in range(9) for t in range(11) if ms[i][t] > 0]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    assert abs(float(masked_mean(x, mask)) - mean) <= TOL
    assert abs(float(masked_var(x, mask)) - var) <= TOL
    assert max_diff(masked_whiten(x, mask) * mask, ref_whiten(xs, ms)) <= TOL
    # per-row means: a fully masked row gives 0, not NaN
    row = masked_mean(x, mask, dim=-1)
    assert float(row[0]) == 0.0
    assert torch.isfinite(row).all()


@pytest.mark.parametrize("value", [0.1, 1 / 3, -2.2, 123.456])
def test_masked_whiten_of_equal_float32_values_is_exactly_zero(value):
    mask = torch.ones(64, 1000)
    mask[::3, 500:] = 0
    x = torch.full((64, 1000), value, dtype=torch.float32)
    x[mask == 0] = 5.0  # padding must not matter
    assert float((masked_whiten(x, mask) * mask).abs().max()) == 0.0


def test_masked_whiten_degenerate_masks_are_finite():
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(masked_whiten(x, torch.zeros(3, 4)) * torch.zeros(3, 4), torch.zeros(3, 4))
    one = torch.zeros(3, 4)
    one[1, 2] = 1
    assert float((masked_whiten(x, one) * one).abs().max()) == 0.0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_reference(seed, holes, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 12, 17, holes)
    rewards = torch.randn(12, 17, generator=gen, dtype=torch.float64) * mask
    values = torch.randn(12, 17, generator=gen, dtype=torch.float64)
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = ref_gae(to_lists(rewards), to_lists(values), to_lists(mask), gamma, lam)
    assert max_diff(adv, ref_adv) <= TOL
    assert max_diff(ret, ref_ret) <= TOL
    assert float((adv * (1 - mask)).abs().max()) == 0.0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_matches_reference_with_shuffled_groups(seed, norm):
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(gen, 40, 9, holes=bool(seed % 2))
    uids = random_groups(gen, 40)
    rewards = outcome_rewards(gen, mask, uids)
    adv, ret = compute_grpo_outcome_advantage(
        rewards, mask, uids, epsilon=1e-6, norm_adv_by_std=norm
    )
    ref = ref_grpo(to_lists(rewards), to_lists(mask), list(uids), 1e-6, norm)
    assert max_diff(adv, ref) <= TOL
    assert torch.equal(adv, ret)


def test_grpo_edge_cases_exact():
    # group "a": ties (zero variance, 0.1 is not representable); "b": a group of one;
    # "c": regular; rows interleaved.
    uids = np.array(["a", "c", "b", "a", "c", "a"], dtype=object)
    scores = torch.tensor([0.1, 1.0, 0.7, 0.1, 0.0, 0.1], dtype=torch.float32)
    mask = torch.ones(6, 3)
    rewards = torch.zeros(6, 3)
    rewards[:, -1] = scores
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, uids)
    assert adv.dtype == torch.float32
    assert torch.equal(adv[[0, 2, 3, 5]], torch.zeros(4, 3))  # exactly 0, not noise / eps
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)  # group c: mean 0.5, unbiased std sqrt(0.5)
    assert adv[1, 0].item() == pytest.approx(expected, rel=1e-6)
    assert adv[4, 0].item() == pytest.approx(-expected, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_rloo_matches_reference_with_shuffled_groups(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    mask = random_mask(gen, 40, 9, holes=bool(seed % 2))
    uids = random_groups(gen, 40)
    rewards = outcome_rewards(gen, mask, uids)
    rewards = rewards + torch.randn(40, 9, generator=gen, dtype=torch.float64) * mask
    adv, ret = compute_rloo_outcome_advantage(rewards, mask, uids)
    assert max_diff(adv, ref_rloo(to_lists(rewards), to_lists(mask), list(uids))) <= TOL
    assert torch.equal(adv, ret)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_matches_reference(seed, gamma):
    gen = torch.Generator().manual_seed(200 + seed)
    mask = random_mask(gen, 16, 13, holes=bool(seed % 2))
    # rewards also on padding: they must not leak into earlier valid tokens
    rewards = torch.randn(16, 13, generator=gen, dtype=torch.float64)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=gamma)
    ref_adv, ref_ret = ref_rpp(to_lists(rewards), to_lists(mask), gamma)
    assert max_diff(adv, ref_adv) <= TOL
    assert max_diff(ret, ref_ret) <= TOL
    if not seed % 2:  # right padding only: the same as verl's reset-at-mask recursion
        verl_adv, verl_ret = ref_rpp_verl(to_lists(rewards), to_lists(mask), gamma)
        assert max_diff(adv, verl_adv) <= TOL
        assert max_diff(ret, verl_ret) <= TOL


def test_reinforce_plus_plus_carries_the_return_through_tool_tokens():
    # Multi-turn: turn 1 (3 tokens), tool output (2 masked tokens), turn 2 (2 tokens), pad.
    # The outcome reward on the last token reaches turn 1 undiscounted by the tool tokens.
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.float64)
    rewards = torch.zeros(1, 8, dtype=torch.float64)
    rewards[0, 6] = 1.0
    rewards[0, 3] = 5.0  # a reward on a tool token is not the policy's: ignored
    _, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    expected = [0.5**4, 0.5**3, 0.5**2, 0.0, 0.0, 0.5, 1.0, 0.0]
    assert ret[0].tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_plus_plus_baseline_matches_reference(seed):
    gen = torch.Generator().manual_seed(300 + seed)
    mask = random_mask(gen, 30, 8, holes=bool(seed % 2))
    uids = random_groups(gen, 30)
    rewards = outcome_rewards(gen, mask, uids)
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    assert max_diff(adv, ref_rpp_baseline(to_lists(rewards), to_lists(mask), list(uids))) <= TOL
    assert torch.equal(adv, ret)


@pytest.mark.parametrize(
    "fn",
    [
        compute_grpo_outcome_advantage,
        compute_rloo_outcome_advantage,
        compute_reinforce_plus_plus_baseline_outcome_advantage,
    ],
)
def test_group_estimators_are_permutation_equivariant(fn):
    """Shuffling the rows (uids not contiguous) permutes the advantages, nothing else."""
    gen = torch.Generator().manual_seed(7)
    uids = np.array([f"p{i // 4}" for i in range(32)], dtype=object)  # contiguous groups of 4
    mask = random_mask(gen, 32, 6, holes=False)
    rewards = torch.randn(32, 6, generator=gen, dtype=torch.float64) * mask
    adv, _ = fn(rewards, mask, uids)
    perm = torch.randperm(32, generator=gen)
    adv_perm, _ = fn(rewards[perm], mask[perm], uids[perm.numpy()])
    assert float((adv_perm - adv[perm]).abs().max()) <= 1e-12


def test_group_index_dense_in_order_of_appearance():
    gid, n = group_index(np.array(["b", "a", "b", 3, "a"], dtype=object))
    assert gid.tolist() == [0, 1, 0, 2, 1]
    assert n == 3


def test_uid_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 uids for 2 rows"):
        compute_grpo_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3), ["a", "b", "c"])
