"""Time the algorithm numerics (rlcore.rl) on a 4,096 x 1,024 batch: ms per call.

    python benchmarks/algorithms.py [--rows 4096] [--length 1024] [--threads 1] [--device cpu]

Timings are wall clock on whatever else the machine runs (a shared machine: compare rows of
one run, not runs). Advantages run on the driver (no grad); losses are timed forward +
backward, as the engines call them (on one micro-batch the size of the whole batch: the
per-token cost is what matters). The "loop" rows are the per-row Python grouping verl uses,
written here only as a baseline for the vectorised group statistics.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
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
from rlcore.rl.kl import apply_kl_penalty, kl_penalty
from rlcore.rl.losses import (
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
from rlcore.rl.rollout_is import rollout_is_weights


def timeit(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def grpo_loop_baseline(rewards: torch.Tensor, mask: torch.Tensor, uids: np.ndarray) -> torch.Tensor:
    """Per-row grouping with Python lists and torch.stack (verl's style), for comparison."""
    scores = rewards.sum(dim=-1)
    groups: dict[object, list[torch.Tensor]] = {}
    for i in range(scores.shape[0]):
        groups.setdefault(uids[i], []).append(scores[i])
    stats = {}
    for k, v in groups.items():
        t = torch.stack(v)
        stats[k] = (t.mean(), t.std() if len(v) > 1 else torch.tensor(1.0))
    out = scores.clone()
    for i in range(scores.shape[0]):
        mean, std = stats[uids[i]]
        out[i] = (scores[i] - mean) / (std + 1e-6)
    return out.unsqueeze(-1) * mask


def gae_column_baseline(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """GAE over strided (B,) columns of the (B, R) tensors (verl's loop), for comparison."""
    next_values = torch.zeros_like(values[:, 0])
    last = torch.zeros_like(next_values)
    out = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        gae = delta + gamma * lam * last
        next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
        last = gae * mask[:, t] + (1 - mask[:, t]) * last
        out.append(last)
    return torch.stack(out[::-1], dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    b, r = args.rows, args.length

    lengths = torch.randint(1, r + 1, (b,), generator=gen)
    mask = (torch.arange(r)[None, :] < lengths[:, None]).float().to(dev)  # (B, R)
    rewards = torch.zeros(b, r)
    rewards[torch.arange(b), lengths - 1] = torch.randint(0, 2, (b,), generator=gen).float()
    rewards = rewards.to(dev)
    values = torch.randn(b, r, generator=gen).to(dev)
    perm = np.random.default_rng(0).permutation(b)  # groups arrive shuffled
    uids = np.array([f"p{i // args.group}" for i in perm], dtype=object)
    old = (-torch.rand(b, r, generator=gen) * 3).to(dev)
    ref = old + 0.1 * torch.randn(b, r, generator=gen).to(dev)
    new = (old + 0.2 * torch.randn(b, r, generator=gen).to(dev)).requires_grad_(True)
    adv = torch.randn(b, r, generator=gen).to(dev) * mask
    totals = BatchTotals(tokens=int(mask.sum()), sequences=b, max_response_length=r)

    def backward(loss: torch.Tensor) -> None:
        new.grad = None
        loss.backward()

    vpred = (values + 0.3 * torch.randn(b, r, generator=gen).to(dev)).requires_grad_(True)

    def value_step() -> None:
        vpred.grad = None
        loss = compute_value_loss(vpred, adv, values, mask, cliprange_value=0.5, totals=totals)[0]
        loss.backward()

    cfg = PolicyGradientAlgorithm.Config()  # the options every policy loss reads

    def pg(mode: str) -> None:
        loss = compute_policy_loss_vanilla(
            old, new, adv, mask, loss_agg_mode=mode, config=cfg, totals=totals
        )
        backward(loss[0])

    def gspo() -> None:
        mode = "seq-mean-token-mean"  # the paper's
        backward(
            compute_policy_loss_gspo(
                old, new, adv, mask, loss_agg_mode=mode, config=cfg, totals=totals
            )[0]
        )

    rollout = old + 0.05 * torch.randn(b, r, generator=gen).to(dev)

    def with_is(level: str) -> None:
        w = rollout_is_weights(old, rollout, mask, level=level, cap=2.0)
        backward(compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode="token-mean",
                                             config=cfg, totals=totals,
                                             rollout_is_weights=w)[0])  # fmt: skip

    def other(fn: Callable[..., tuple[torch.Tensor, object]]) -> Callable[[], None]:
        return lambda: backward(
            fn(old, new, adv, mask, loss_agg_mode="token-mean", config=cfg, totals=totals)[0]
        )

    def kl_loss(name: str) -> None:
        backward(agg_loss(kl_penalty(new, ref, name), mask, "token-mean", totals))

    gae, gae_base = "GAE advantages (gamma=1, lam=0.95)", "GAE, strided-column loop baseline"
    grpo, grpo_base = "GRPO advantages (uid groups of 8)", "GRPO, per-row Python loop baseline"
    rpp = compute_reinforce_plus_plus_outcome_advantage
    rpp_baseline = compute_reinforce_plus_plus_baseline_outcome_advantage
    rows: list[tuple[str, Callable[[], object]]] = [
        (gae, lambda: compute_gae_advantage_return(rewards, values, mask, 1.0, 0.95)),
        (gae_base, lambda: gae_column_baseline(rewards, values, mask, 1.0, 0.95)),
        (grpo, lambda: compute_grpo_outcome_advantage(rewards, mask, uids)),
        (grpo_base, lambda: grpo_loop_baseline(rewards, mask, uids)),
        ("RLOO advantages", lambda: compute_rloo_outcome_advantage(rewards, mask, uids)),
        ("REINFORCE++ advantages", lambda: rpp(rewards, mask)),
        ("REINFORCE++ group-baseline advantages", lambda: rpp_baseline(rewards, mask, uids)),
        ("KL penalty in reward (k1)", lambda: apply_kl_penalty(rewards, old, ref, mask, coef=0.01)),
        ("policy loss vanilla fwd+bwd (token-mean)", lambda: pg("token-mean")),
        ("policy loss vanilla fwd+bwd (seq-mean-token-mean)", lambda: pg("seq-mean-token-mean")),
        ("policy loss GSPO fwd+bwd", gspo),
        ("policy loss vanilla + token rollout IS fwd+bwd", lambda: with_is("token")),
        ("policy loss vanilla + sequence rollout IS fwd+bwd", lambda: with_is("sequence")),
        ("policy loss CISPO fwd+bwd", other(compute_policy_loss_cispo)),
        ("policy loss GPG fwd+bwd", other(compute_policy_loss_gpg)),
        ("policy loss SAPO fwd+bwd", other(compute_policy_loss_sapo)),
        ("policy loss GMPO fwd+bwd", other(compute_policy_loss_gmpo)),
        ("policy loss KL-Cov fwd+bwd", other(compute_policy_loss_kl_cov)),
        ("KL loss k3 fwd+bwd", lambda: kl_loss("k3")),
        ("KL loss k3+ fwd+bwd", lambda: kl_loss("k3+")),
        ("value loss fwd+bwd", value_step),
    ]

    print(
        f"rlcore.rl numerics, {b} x {r}, {args.device}, {args.threads} thread(s), "
        f"median of {args.repeat}"
    )
    print(f"| {'operation':<52} | {'ms/call':>9} |")
    print(f"|{'-' * 54}|{'-' * 11}|")
    results = {}
    for name, fn in rows:
        results[name] = timeit(fn, args.repeat, sync)
        print(f"| {name:<52} | {results[name]:>9.1f} |")
    print(f"\nGAE time-major loop vs strided columns: {results[gae_base] / results[gae]:.1f}x")
    print(f"GRPO vectorised groups vs per-row loop: {results[grpo_base] / results[grpo]:.1f}x")


if __name__ == "__main__":
    main()
