"""``check_algorithm``: advantages respect the mask, losses are split-invariant token sums."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from rlcore.interfaces import AlgorithmNeeds, BaseAlgorithm, BatchTotals, ModelOutputs
from rlcore.protocol import DataProto
from rlcore.testing.conformance._common import fail
from rlcore.testing.conformance._contract import check_class, construct

__all__ = ["POLICY_METRICS", "check_algorithm", "random_algorithm_batch"]

# The names BaseAlgorithm.policy_loss documents (kl_loss/entropy only when used).
POLICY_METRICS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")

# Row lengths of the random batch: rows 4 and 5 are fully masked (a response cut to nothing).
_LENGTHS = (6, 3, 1, 4, 0, 0, 5, 2)
# Prompt ids in no particular order; "c" is a group of one, "d" holds a fully masked row.
_UIDS = ("a", "b", "a", "c", "d", "a", "b", "d")
# Uneven micro-batches, one holding a single fully masked row.
_SPLITS = ((0, 3), (3, 4), (4, 5), (5, 8))
_RTOL = 1e-6
_ATOL = 1e-12


def random_algorithm_batch(
    *,
    needs_critic: bool,
    needs_reference: bool,
    seed: int = 0,
    extra_log_probs: Sequence[str] = (),
) -> DataProto:
    """The driver-side batch an algorithm sees before ``compute_rewards``, float64, (8, 6).

    ``token_level_scores`` holds each row's outcome score on its last valid token (as the
    reward manager places it); ``old_log_probs``/``ref_log_prob``/``values`` are finite at every
    position (engines compute them under padding too) so only the mask can hide them.
    ``extra_log_probs``: more keys of the same kind, e.g. the extra roles' outputs
    (``teacher_log_prob``, :attr:`ExtraRole.output_key`).
    """
    g = torch.Generator().manual_seed(seed)
    rows, width = len(_LENGTHS), max(_LENGTHS)
    lengths = torch.tensor(_LENGTHS)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)  # (B, R)
    scores = torch.zeros(rows, width, dtype=torch.float64)
    outcome = torch.rand(rows, generator=g, dtype=torch.float64).round() + 0.25
    for i, n in enumerate(_LENGTHS):
        if n:
            scores[i, n - 1] = outcome[i]
    tensors = {
        "response_mask": mask,
        "token_level_scores": scores,
        "old_log_probs": -3.0 * torch.rand(rows, width, generator=g, dtype=torch.float64),
        "responses": torch.randint(3, 200, (rows, width), generator=g),
    }
    if needs_reference:
        tensors["ref_log_prob"] = -3.0 * torch.rand(rows, width, generator=g, dtype=torch.float64)
    if needs_critic:
        tensors["values"] = torch.randn(rows, width, generator=g, dtype=torch.float64)
    for key in extra_log_probs:
        tensors[key] = -3.0 * torch.rand(rows, width, generator=g, dtype=torch.float64)
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(_UIDS, dtype=object)})


def _check_matrix(what: str, rule: str, name: str, t: Any, mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(what, rule, f"batch[{name!r}] is {type(t).__name__}, not a tensor")
    if tuple(t.shape) != tuple(mask.shape):
        fail(
            what, rule, f"batch[{name!r}] has shape {tuple(t.shape)}, expected {tuple(mask.shape)}"
        )
    if not bool(torch.isfinite(t).all()):
        fail(what, rule, f"batch[{name!r}] has non-finite values")
    return t


def _check_metrics(
    what: str, rule: str, metrics: Any, prefix: str, required: Sequence[str]
) -> None:
    if not isinstance(metrics, dict):
        fail(what, rule, f"metrics must be a dict, got {type(metrics).__name__}")
    for key, value in metrics.items():
        if not (isinstance(key, str) and key.startswith(prefix)):
            fail(what, rule, f"metric name {key!r} must start with {prefix!r}")
        if not isinstance(value, float | int) or isinstance(value, bool):
            fail(what, rule, f"metric {key!r} must be a Python float, got {type(value).__name__}")
        if not math.isfinite(value):
            fail(what, rule, f"metric {key!r} is {value}")
    missing = [k for k in required if k not in metrics]
    if missing:
        fail(what, rule, f"missing documented metrics {missing}; got {sorted(metrics)}")


LossMethod = Callable[
    [ModelOutputs, DataProto, BatchTotals], "tuple[torch.Tensor, dict[str, float]]"
]


def _check_loss(
    what: str,
    label: str,
    loss_fn: LossMethod,
    make_outputs: Callable[[torch.Tensor, torch.Tensor], ModelOutputs],
    leaves: tuple[torch.Tensor, torch.Tensor],
    batch: DataProto,
    prefix: str,
    required: Sequence[str],
) -> None:
    """Scalar with gradient, zero gradient under the mask, split invariance (float64)."""
    mask = batch.batch["response_mask"]
    totals = BatchTotals(
        tokens=int(mask.sum()), sequences=len(batch), max_response_length=int(mask.shape[1])
    )
    rule = f"{label} must return (scalar loss with gradient, dict of float metrics)"
    loss, metrics = loss_fn(make_outputs(*leaves), batch, totals)
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        fail(what, rule, f"loss is {type(loss).__name__} of shape {getattr(loss, 'shape', None)}")
    if not loss.requires_grad:
        fail(what, rule, "the loss carries no gradient (detached from the model outputs?)")
    if not bool(torch.isfinite(loss)):
        fail(what, rule, f"loss is {float(loss)}")
    _check_metrics(what, rule, metrics, prefix, required)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    full = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]
    if not any(bool(g.abs().sum() > 0) for g in full):
        fail(what, rule, "the gradient of the loss is zero everywhere")
    outside = mask == 0
    for g in full:
        if not bool(torch.isfinite(g).all()):
            fail(what, f"{label} gradient must be finite", "non-finite gradient")
        if bool(g[outside].abs().max() > 0):
            fail(
                what,
                f"{label} must not depend on tokens outside response_mask",
                f"gradient {float(g[outside].abs().max()):.3g} on a masked position",
            )

    # Token-mean split invariance (BatchTotals): micro-batch losses, each normalised by the
    # mini-batch totals, sum to the mini-batch loss and give the same gradient.
    parts = []
    for start, end in _SPLITS:
        sliced = make_outputs(leaves[0][start:end], leaves[1][start:end])
        part, _ = loss_fn(sliced, batch[start:end], totals)
        parts.append(part)
    summed = torch.stack(parts).sum()
    rule = (
        f"{label} must be split-invariant: normalise by the BatchTotals passed in, not by the "
        "micro-batch's own counts (sum of micro-batch losses == whole-batch loss)"
    )
    if not torch.allclose(summed, loss.detach(), rtol=_RTOL, atol=_ATOL):
        splits = [f"{s}:{e}" for s, e in _SPLITS]
        fail(
            what,
            rule,
            f"micro-batches {splits} sum to {summed.item()!r}, whole batch {loss.item()!r}",
        )
    micro = torch.autograd.grad(summed, leaves, allow_unused=True)
    for x, g, ref in zip(leaves, micro, full):
        got = torch.zeros_like(x) if g is None else g
        if not torch.allclose(got, ref, rtol=_RTOL, atol=_ATOL):
            diff = float((got - ref).abs().max())
            fail(what, rule, f"gradients differ by up to {diff:.3g}")


def check_algorithm(
    cls: type[BaseAlgorithm],
    config: BaseAlgorithm.Config | None = None,
    *,
    seed: int = 0,
    policy_metrics: Sequence[str] = POLICY_METRICS,
) -> None:
    """Check an algorithm class against the :class:`~rlcore.interfaces.BaseAlgorithm` contract.

    On :func:`random_algorithm_batch` (float64, fully masked rows, a group of one, uids out of
    order): ``compute_rewards`` then ``compute_advantages`` give finite (B, R)
    ``token_level_rewards``, ``advantages`` and ``returns``, zero outside ``response_mask``,
    and the same values (permuted) when the rows are permuted. The batch holds each
    extra role's output (``needs.extra_roles``: ``<name>_log_prob``). ``policy_loss`` (and
    ``value_loss`` when ``needs_critic``) is a finite scalar with a gradient that is zero
    outside the mask, metrics are floats named ``actor/...`` (``critic/...``) including
    ``policy_metrics``, and micro-batch losses sum to the whole-batch loss with the same
    gradient (rtol 1e-6). Pass ``config`` to check non-default options (e.g. every
    ``loss_agg_mode``).
    """
    what, config = check_class(cls, BaseAlgorithm, config, "algorithm")
    algo = construct(what, cls, config, "algorithm")
    needs = algo.needs
    if not isinstance(needs, AlgorithmNeeds):
        fail(what, "needs must return an rlcore.interfaces.AlgorithmNeeds", repr(needs))
    critic, ref = needs.critic, needs.reference
    extra = tuple(role.output_key for role in needs.extra_roles)  # what the roles computed
    batch = random_algorithm_batch(
        needs_critic=critic, needs_reference=ref, seed=seed, extra_log_probs=extra
    )
    mask = batch.batch["response_mask"]
    outside = mask == 0

    rule = "compute_rewards must return (batch with token_level_rewards (B, R), dict of metrics)"
    result = algo.compute_rewards(batch)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], DataProto)):
        fail(what, rule, f"got {type(result).__name__}")
    batch, metrics = result
    _check_metrics(what, rule, metrics, "", ())
    rewards = _check_matrix(
        what, rule, "token_level_rewards", batch.batch.get("token_level_rewards"), mask
    )
    if bool(rewards[outside].abs().max() > 0):
        fail(what, "token_level_rewards must be zero outside response_mask", "a masked reward")

    rule = "compute_advantages must add finite (B, R) advantages and returns"
    out = algo.compute_advantages(batch)
    if not isinstance(out, DataProto) or len(out) != len(mask):
        fail(what, rule, f"returned {out!r} for {len(mask)} rows")
    for key in ("advantages", "returns"):
        t = _check_matrix(what, rule, key, out.batch.get(key), mask)
        if bool(t[outside].abs().max() > 0):
            row = int(outside.nonzero()[t[outside].abs().argmax()][0])
            fail(
                what,
                f"{key} must be zero outside response_mask",
                f"{key}[{row}] is non-zero after the response ended (row length {_LENGTHS[row]})",
            )

    # Rows may arrive in any order (groups are keyed by uid): permuting the rows permutes
    # the advantages.
    perm = torch.randperm(len(mask), generator=torch.Generator().manual_seed(seed + 1))
    shuffled = random_algorithm_batch(
        needs_critic=critic, needs_reference=ref, seed=seed, extra_log_probs=extra
    )
    shuffled = shuffled.select_idxs(perm.numpy())
    shuffled, _ = cls(config).compute_rewards(shuffled)
    shuffled = cls(config).compute_advantages(shuffled)
    for key in ("advantages", "returns"):
        if not torch.allclose(shuffled.batch[key], out.batch[key][perm], rtol=_RTOL, atol=1e-9):
            fail(
                what,
                "compute_advantages must not depend on the order of rows (group by uid)",
                f"{key} changed when the rows were permuted",
            )

    g = torch.Generator().manual_seed(seed + 2)
    old = out.batch["old_log_probs"]
    log_probs = (old + 0.3 * torch.randn(old.shape, generator=g, dtype=old.dtype)).requires_grad_()
    entropy = torch.rand(old.shape, generator=g, dtype=old.dtype).requires_grad_()
    _check_loss(
        what,
        "policy_loss",
        algo.policy_loss,
        lambda lp, ent: ModelOutputs(log_probs=lp, entropy=ent),
        (log_probs, entropy),
        out,
        "actor/",
        policy_metrics,
    )
    if critic:
        values = out.batch["values"]
        vpreds = values + 0.4 * torch.randn(values.shape, generator=g, dtype=values.dtype)
        vpreds.requires_grad_()
        unused = torch.zeros_like(values).requires_grad_()
        _check_loss(
            what,
            "value_loss",
            algo.value_loss,
            lambda v, _: ModelOutputs(values=v),
            (vpreds, unused),
            out,
            "critic/",
            (),
        )
