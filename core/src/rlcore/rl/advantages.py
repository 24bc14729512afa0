"""Advantage estimators: GAE (PPO), GRPO, RLOO, REINFORCE++ (plain and with a group baseline).

Each takes (B, R) response-aligned tensors and returns ``(advantages, returns)``, both (B, R)
and zero outside ``response_mask``. Semantics follow verl's ``core_algos`` except where a
docstring says otherwise. They run on the driver under ``torch.no_grad``.

Outcome estimators (GRPO, RLOO, REINFORCE++-baseline) use one scalar score per response,
``token_level_rewards.sum(-1)``, and group responses by the prompt's uid. Groups may arrive in
any order (uids need not be contiguous). Group statistics are computed in float64: a
zero-variance group of float32 scores (e.g. all 0.1) must give exactly 0, not rounding noise
divided by ``epsilon``.

The ``*_estimator`` functions at the end are the registered ones (``[algorithm]
adv_estimator``, :mod:`rlcore.builtin`): each has the one signature of
:class:`rlcore.rl.registry.AdvantageEstimatorFn` and reads its options from the algorithm's
``Config``; :func:`estimator_options` lists them, so a config whose algorithm lacks one is
refused before the run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from rlcore.interfaces import key
from rlcore.rl.masked import apply_mask, masked_whiten

if TYPE_CHECKING:
    from rlcore.rl.registry import AdvantageEstimatorFn

__all__ = [
    "GRPOOptions",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "estimator_options",
    "gae_estimator",
    "group_index",
    "grpo_estimator",
    "reads_options",
    "reinforce_plus_plus_baseline_estimator",
    "reinforce_plus_plus_estimator",
    "rloo_estimator",
]


def group_index(uids: Sequence[Hashable] | np.ndarray) -> tuple[torch.Tensor, int]:
    """Map each row's uid to a dense group id: ``(gid (B,) int64, number of groups)``.

    A dict keeps any hashable uid (str, int, uuid) and order of first appearance; a Python
    loop over B (thousands) costs about a millisecond, far below the rest of a step.
    """
    ids: dict[Hashable, int] = {}
    items = uids.tolist() if isinstance(uids, np.ndarray) else uids
    gid = [ids.setdefault(u, len(ids)) for u in items]
    return torch.tensor(gid, dtype=torch.int64), len(ids)


def _group_sums(x: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group sums of a (B,) tensor: (G,)."""
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, gid, x)


def _outcome_scores(
    token_level_rewards: torch.Tensor, uids: Sequence[Hashable] | np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, torch.Tensor]:
    """float64 scores (B,), group ids (B,), number of groups, per-row group size and mean (B,)."""
    if len(uids) != token_level_rewards.shape[0]:
        msg = f"got {len(uids)} uids for {token_level_rewards.shape[0]} rows"
        raise ValueError(msg)
    scores = token_level_rewards.to(torch.float64).sum(dim=-1)  # (B,) outcome reward
    gid, num_groups = group_index(uids)
    gid = gid.to(scores.device)
    counts = _group_sums(torch.ones_like(scores), gid, num_groups)  # (G,)
    means = _group_sums(scores, gid, num_groups) / counts  # (G,), every group has >= 1 row
    return scores, gid, num_groups, counts[gid], means[gid]


def _broadcast(adv: torch.Tensor, like: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # (B,) float64 -> (B, R) in the rewards' dtype, zero on padding.
    return apply_mask(adv.to(like.dtype).unsqueeze(-1).expand_as(like), mask)


def _whitened(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` whitened over the valid tokens of the whole batch, zero on padding."""
    return apply_mask(masked_whiten(x, mask), mask)


def _scan_backwards(
    valid: torch.Tensor, step: Callable[..., tuple[Any, torch.Tensor]], state: Any, *series: Any
) -> torch.Tensor:
    """A recursion backwards over t: ``state, out[:, t] = step(state, valid[:, t], *(x[:, t]
    for x in series))`` from the last token to the first; ``out`` (B, R) in ``series[0]``'s dtype.

    It works on time-major (R, B) copies: each step then reads contiguous rows instead of a
    strided column (2-3x faster at 4096 x 1024, benchmarks/algorithms.py). The loop is
    sequential in t by nature; each step works on (B,) vectors.
    """
    valid_t = valid.t().contiguous()  # (R, B)
    series_t = [x.t().contiguous() for x in series]  # (R, B) each
    out_t = torch.empty_like(series_t[0])  # (R, B)
    for t in reversed(range(out_t.shape[0])):
        state, out_t[t] = step(state, valid_t[t], *(x[t] for x in series_t))
    return out_t.t().contiguous()  # (B, R)


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (PPO), as verl's ``compute_gae_advantage_return``.

    Backwards over t: ``delta_t = r_t + gamma * V_next - V_t``,
    ``A_t = delta_t + gamma * lam * A_next``; padding tokens neither carry a value nor a TD
    error (``V_next`` and ``A_next`` skip over them). ``returns = A + V`` (raw advantages);
    the advantages are then whitened over all valid tokens of the batch.
    """
    mask = response_mask.to(values.dtype)  # (B, R)

    def step(
        state: tuple[torch.Tensor, torch.Tensor],
        valid: torch.Tensor,
        value: torch.Tensor,
        reward_minus_value: torch.Tensor,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        next_value, last_gae = state  # (B,) each, from the next valid token
        # delta_t + gamma * lam * A_next = r_t - V_t + gamma * V_next + gamma * lam * A_next
        gae = torch.add(reward_minus_value, next_value, alpha=gamma)
        gae.add_(last_gae, alpha=gamma * lam)
        # Keep the running value / advantage across padding: only valid tokens update them.
        next_value = torch.where(valid, value, next_value)
        last_gae = torch.where(valid, gae, last_gae)
        return (next_value, last_gae), last_gae

    # NaN/inf at padding never reaches a valid token: the running values only take valid
    # positions, and the result is selected with the mask.
    zeros = torch.zeros_like(values[:, 0])  # (B,)
    advantages = _scan_backwards(
        mask > 0, step, (zeros, torch.zeros_like(zeros)), values, token_level_rewards - values
    )
    returns = apply_mask(advantages + values, mask)
    return _whitened(advantages, mask), returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    uids: Sequence[Hashable] | np.ndarray,
    *,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: ``(score - group mean) / (group std + epsilon)``; Dr. GRPO drops the std.

    The std is the unbiased (Bessel-corrected) one, as ``torch.std`` in verl. A group of one
    gets advantage 0 (verl instead uses mean 0 and std 1 there, i.e. the raw score): a
    response with no sibling has no baseline to compare with. ``returns = advantages``.
    """
    scores, gid, num_groups, sizes, means = _outcome_scores(token_level_rewards, uids)
    centered = scores - means  # (B,); exactly 0 for a group of one and for ties
    adv = centered
    if norm_adv_by_std:
        sq = _group_sums(centered * centered, gid, num_groups)[gid]  # (B,)
        std = torch.sqrt(sq / (sizes - 1).clamp(min=1))  # (B,)
        adv = centered / (std + epsilon)
    adv = torch.where(sizes > 1, adv, torch.zeros_like(adv))
    out = _broadcast(adv, token_level_rewards, response_mask)
    return out, out


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    uids: Sequence[Hashable] | np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``score_i - mean of the other scores in the group`` (arXiv 2402.14740).

    Equal to verl's ``n / (n - 1) * (score - group mean)``. A group of one has no other
    score, so its advantage is 0 (verl leaves the raw score there). ``returns = advantages``.
    """
    scores, _, _, sizes, means = _outcome_scores(token_level_rewards, uids)
    others_mean = (means * sizes - scores) / (sizes - 1).clamp(min=1)  # (B,)
    adv = torch.where(sizes > 1, scores - others_mean, torch.zeros_like(scores))
    out = _broadcast(adv, token_level_rewards, response_mask)
    return out, out


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (arXiv 2501.03262): discounted returns, whitened over the batch.

    ``G_t = r_t + gamma * G_{t+1}`` over the *valid* tokens only: a masked token is not an
    action, so it neither adds its reward nor counts as a discount step, and the return is
    carried through it to the valid tokens before. With a plain right-padded mask this is
    verl's recursion exactly (it resets the return at masked tokens, and nothing follows the
    padding). With gaps in the mask (multi-turn: tool output inside the response) verl's
    reset would cut the outcome reward off every turn before the last tool call, so those
    turns would learn nothing from the outcome; carrying it through is what multi-turn needs
    (as GAE here skips padding). ``advantages = whiten(G)`` over all valid tokens;
    ``returns = G``; both 0 on masked tokens.
    """

    def step(
        running: torch.Tensor, valid: torch.Tensor, reward: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        running = torch.where(valid, torch.add(reward, running, alpha=gamma), running)
        return running, running

    start = torch.zeros_like(token_level_rewards[:, 0])  # (B,)
    returns = _scan_backwards(response_mask != 0, step, start, token_level_rewards)
    returns = apply_mask(returns, response_mask)  # (B, R)
    return _whitened(returns, response_mask), returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    uids: Sequence[Hashable] | np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: ``score - group mean``, whitened over the batch.

    The group mean includes the response itself, so a group of one gets 0 before whitening
    (verl uses mean 0 there). ``returns = advantages``.
    """
    scores, _, _, _, means = _outcome_scores(token_level_rewards, uids)
    centered = _broadcast(scores - means, token_level_rewards, response_mask)  # (B, R)
    out = _whitened(centered, response_mask)
    return out, out


# --- the registered estimators (one signature) ----------------------------------------------

_UIDS = "non_tensor_batch['uid'] (the prompt id of each sample)"
_CRITIC = "batch['values'] from a critic (an algorithm with one, e.g. ppo)"


def _need(x: Any, what: str, estimator: str) -> Any:
    # A KeyError, as require() raises for a missing batch key.
    if x is None:
        msg = f"adv_estimator {estimator!r} needs {what}"
        raise KeyError(msg)
    return x


# Each built-in estimator's options, declared where it is registered (a value read by
# estimator_options, not an attribute set on the function).
_OPTIONS: dict[AdvantageEstimatorFn, tuple[str, ...]] = {}


def _registered(
    name: str,
    compute: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    *,
    reads: tuple[str, ...] = (),
    uids: bool = False,
    critic: bool = False,
) -> AdvantageEstimatorFn:
    """``compute`` behind the one :class:`AdvantageEstimatorFn` signature, as ``name``.

    Every option in ``reads`` is a ``Config`` field passed on under the same keyword (and is
    the estimator's :func:`estimator_options`, checked when the config is loaded); ``uids`` /
    ``critic``: ``compute`` takes ``uids`` / ``values``, which must then be given.
    """

    def estimator(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        config: Any,
        index: np.ndarray | None = None,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        extra = {key: getattr(config, key) for key in reads}
        if uids:
            extra["uids"] = _need(index, _UIDS, name)
        if critic:
            extra["values"] = _need(values, _CRITIC, name)
        return compute(token_level_rewards, response_mask=response_mask, **extra)

    # The name the registry's messages (and a reader of a traceback) see.
    estimator.__name__ = estimator.__qualname__ = f"{name}_estimator"
    options = f" ({', '.join(f'``{k}``' for k in reads)})" if reads else ""
    estimator.__doc__ = f"``{name}``: :func:`{compute.__name__}`{options}."
    return reads_options(*reads)(estimator)


def reads_options(*keys: str) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Declare the ``Config`` fields an estimator reads (a plugin's too), so that a config
    whose algorithm lacks one is refused when it loads::

        @reads_options("gamma", "lam")
        def my_estimator(token_level_rewards, response_mask, *, config, index=None, values=None):
            ...
    """

    def declare(estimator: AdvantageEstimatorFn) -> AdvantageEstimatorFn:
        _OPTIONS[estimator] = keys
        return estimator

    return declare


def estimator_options(estimator: AdvantageEstimatorFn) -> tuple[str, ...]:
    """The ``Config`` fields ``estimator`` reads (checked when the config is loaded); none for
    an estimator that reads its options itself (a plugin's)."""
    return _OPTIONS.get(estimator, ())


@attrs.frozen(kw_only=True, slots=False)
class GRPOOptions:
    """The ``grpo`` estimator's options, declared once with the estimator: an algorithm whose
    ``adv_estimator`` may be ``grpo`` mixes them into its ``Config``
    (``class Config(PolicyGradientAlgorithm.Config, GRPOOptions)``). Not slotted, so it mixes
    into any algorithm's (slotted) ``Config``."""

    norm_adv_by_std: bool = key(
        True, "Divide by the group's std (GRPO); false: only subtract the mean (Dr. GRPO)."
    )
    epsilon: float = key(
        1e-6, "Added to the group's std before dividing.", validator=attrs.validators.gt(0.0)
    )


gae_estimator = _registered(
    "gae", compute_gae_advantage_return, reads=("gamma", "lam"), critic=True
)
grpo_estimator = _registered(
    "grpo",
    compute_grpo_outcome_advantage,
    reads=tuple(sorted(field.name for field in attrs.fields(GRPOOptions))),
    uids=True,
)
rloo_estimator = _registered("rloo", compute_rloo_outcome_advantage, uids=True)
reinforce_plus_plus_estimator = _registered(
    "reinforce_plus_plus", compute_reinforce_plus_plus_outcome_advantage, reads=("gamma",)
)
reinforce_plus_plus_baseline_estimator = _registered(
    "reinforce_plus_plus_baseline",
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    uids=True,
)
