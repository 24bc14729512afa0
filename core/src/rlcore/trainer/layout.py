"""Row layout for the update passes: whole mini-batches per rank, padded with zero-weight rows.

The driver expands prompts to rows once (``n`` per prompt). An update's rows are any rows a
step program hands it (all ``train_batch_size x n``, or the subset it keeps: best-of-n,
pairs). They split into the configured number of mini-batches, near-equal and contiguous
(:func:`mini_batch_bounds`; for the full batch, mini-batch ``m`` is rows ``[m*S, (m+1)*S)``,
``S`` = mini-batch prompts x ``n``). Each mini-batch is padded to a multiple of the world size
``W`` (fewer than ``W`` rows; none on one rank) with rows whose ``response_mask`` is all zero
(they carry no tokens, so every loss ignores them and :func:`rlcore.engine.batch_totals` does
not count them), then the rows are ordered rank-major: rank ``r`` gets its share of
mini-batch 0, then of mini-batch 1, ... Dispatch then splits the batch into ``W`` equal
contiguous chunks (no padding of its own, which would duplicate real rows), and each rank
cuts its chunk into the mini-batches' sizes (``meta_info["mini_batch_rows"]``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from rlcore.engine import prompt_group_starts
from rlcore.roles.levers import trained_rows

if TYPE_CHECKING:
    from rlcore.protocol import DataProto

__all__ = [
    "balanced_shares",
    "group_index",
    "mini_batch_bounds",
    "mini_batch_layout",
    "prompt_groups",
]


def balanced_shares(
    rows: list[int], lengths: list[int], world_size: int, groups: list[int] | None = None
) -> list[list[int]]:
    """``rows`` split into ``world_size`` shares of equal size with near-equal token sums.

    Greedy longest-first: each unit, heaviest first, goes to the share with the fewest tokens
    that still has room (``len(rows) / world_size`` rows each; the caller pads to a multiple).
    A unit is one row, or with ``groups`` a run of rows with the same group id (the samples
    of one prompt): kept on one rank, in order, so the engine can pack their shared prompt
    once; a unit larger than any share's room is split over shares. A share's units are
    ordered by mean row length, so a token-budget split wastes little padding.
    ``lengths[i]`` is the token count of ``rows[i]``; a padding row (-1) counts as 0 and is a
    unit of its own.
    """
    size = len(rows) // world_size
    units: list[list[int]] = []
    for i in range(len(rows)):
        real_pair = i > 0 and rows[i] >= 0 and rows[i - 1] >= 0
        if groups is not None and real_pair and groups[i] == groups[i - 1]:
            units[-1].append(i)
        else:
            units.append([i])
    shares: list[list[list[int]]] = [[] for _ in range(world_size)]
    room = [size] * world_size
    sums = [0] * world_size
    weight = [sum(lengths[i] for i in unit) for unit in units]
    for u in sorted(range(len(units)), key=lambda u: (-weight[u], units[u][0])):
        pending = units[u]
        while pending:
            fits = [r for r in range(world_size) if room[r] >= len(pending)]
            open_ = fits or [r for r in range(world_size) if room[r] > 0]
            target = min(open_, key=lambda r: (sums[r], r))
            part, pending = pending[: room[target]], pending[room[target] :]
            shares[target].append(part)
            room[target] -= len(part)
            sums[target] += sum(lengths[i] for i in part)

    def mean_length(part: list[int]) -> tuple[float, int]:
        return (sum(lengths[i] for i in part) / len(part), part[0])

    return [[rows[i] for part in sorted(share, key=mean_length) for i in part] for share in shares]


def prompt_groups(batch: DataProto) -> list[int] | None:
    """Per row, an id shared by adjacent rows with the same prompt; None without the keys.

    The test is :func:`rlcore.engine.prompt_group_starts`, which the FSDP2 engine's
    shared-prompt packing uses too.
    """
    keys = ("input_ids", "attention_mask", "responses")
    if any(k not in batch.batch for k in keys):
        return None
    b = batch.batch
    starts = prompt_group_starts(b["input_ids"], b["attention_mask"], b["responses"].shape[1])
    return (starts.long().cumsum(0) - 1).tolist()


def group_index(batch: DataProto) -> list[int]:
    """Per row, its group (``uid``, the prompt it was sampled from) as an int, numbered by
    first appearance: what :func:`mini_batch_layout` keeps together with ``keep_groups``."""
    if "uid" not in batch.non_tensor_batch:
        msg = "keep_groups: the batch has no 'uid' (each row's prompt id, set by the loader)"
        raise ValueError(msg)
    ids: dict[object, int] = {}
    return [ids.setdefault(uid, len(ids)) for uid in batch.non_tensor_batch["uid"]]


def mini_batch_bounds(
    rows: int, *, rows_per_mini_batch: int, mini_batches: int | None, groups: list[int] | None
) -> list[tuple[int, int]]:
    """``[start, end)`` of each mini-batch's real rows.

    ``mini_batches`` given: that many near-equal parts of ``rows`` (fewer when there are
    fewer rows, or fewer groups), so a program that trains a subset of its rows still takes
    the configured number of optimizer steps; for a full batch (``rows`` =
    ``mini_batches x rows_per_mini_batch``) the parts are the configured mini-batches.
    None: ``rows_per_mini_batch`` rows each, the last may be shorter. ``groups``: a bound
    never falls inside a group (its rows are contiguous): it moves to the group's start.
    """
    if mini_batches is None:
        per = max(1, min(rows_per_mini_batch, rows))
        cuts = list(range(per, rows, per))
    else:
        parts = max(1, min(mini_batches, rows))
        cuts = [round(m * rows / parts) for m in range(1, parts)]
    if groups is not None:
        starts = [i for i in range(rows) if i == 0 or groups[i] != groups[i - 1]]
        cuts = [max((s for s in starts if s <= c), default=0) for c in cuts]
    edges = sorted({0, rows, *cuts})
    return list(itertools.pairwise(edges))


def _group_shares(
    rows: list[int], groups: list[int], lengths: list[int], world_size: int
) -> list[list[int]]:
    """``rows`` (one mini-batch) into ``world_size`` shares of whole groups, padded (-1) to
    the same size: each group, largest first, goes to the share with the fewest rows (then
    tokens). Shares keep the groups' order, so a group's rows stay adjacent."""
    units: list[list[int]] = []
    for i, row in enumerate(rows):
        if i and groups[row] == groups[rows[i - 1]]:
            units[-1].append(row)
        else:
            units.append([row])
    shares: list[list[int]] = [[] for _ in range(world_size)]
    tokens = [0] * world_size
    for u in sorted(range(len(units)), key=lambda u: (-len(units[u]), u)):
        target = min(range(world_size), key=lambda r: (len(shares[r]), tokens[r], r))
        shares[target].append(u)
        tokens[target] += sum(lengths[i] for i in units[u]) if lengths else 0
    size = max(sum(len(units[u]) for u in share) for share in shares)
    out = []
    for share in shares:
        flat = [row for u in sorted(share) for row in units[u]]
        out.append(flat + [-1] * (size - len(flat)))
    return out


def mini_batch_layout(
    batch: DataProto,
    *,
    rows_per_mini_batch: int,
    world_size: int,
    mini_batches: int | None = None,
    groups: list[int] | None = None,
    balance_tokens: bool = False,
    skips_zero_advantage_rows: bool = False,
) -> DataProto:
    """``batch`` (tensors only) reordered and padded as described in the module docstring.

    ``mini_batches``: how many optimizer steps the update takes (the rows split into that
    many near-equal parts, :func:`mini_batch_bounds`); None: ``rows_per_mini_batch`` each.
    ``meta_info["mini_batch_rows"]`` of the result lists each mini-batch's rows per rank
    (what :class:`rlcore.roles.update.RoleTrainer` cuts a rank's chunk into).
    ``groups`` (per row, e.g. :func:`group_index`): the rows of one group stay in one
    mini-batch, on one rank, adjacent (rows are first ordered by group, stably), and the
    result carries them as ``group_index`` (B,) int64 (padding rows: -1 - position) so that
    the engine's micro-batches keep them together too
    (:func:`rlcore.engine.split_micro_batches`): what a pairwise loss needs.
    ``balance_tokens``: within each mini-batch, give every rank about the same number of
    tokens (:func:`balanced_shares`) instead of contiguous rows: a mini-batch's rows, and so
    its gradient, are the same; the slowest rank, which every rank waits for, is faster. The
    samples of one prompt (:func:`prompt_groups`) stay together on a rank where they fit.
    ``skips_zero_advantage_rows``: the update leaves zero-advantage rows out of its backward
    (:func:`rlcore.roles.levers.drop_zero_advantage_rows`), so their tokens cost a rank
    nothing and count 0 here: ranks get about the same tokens to train, not to hold.
    """
    rows = len(batch)
    if groups is not None:  # each group's rows contiguous, in order of first appearance
        given = groups
        first: dict[int, int] = {}
        for i, g in enumerate(given):
            first.setdefault(g, i)
        ordered = sorted(range(rows), key=lambda i: (first[given[i]], i))
        batch = batch.select_idxs(np.asarray(ordered, dtype=np.int64))
        groups = [given[i] for i in ordered]
    lengths: list[int] = []
    if balance_tokens:
        counts = batch.batch["attention_mask"].sum(-1)
        if skips_zero_advantage_rows and "advantages" in batch.batch:
            counts = counts * trained_rows(batch)  # a dropped row costs its rank nothing
        lengths = counts.tolist()
    prompts = prompt_groups(batch) if balance_tokens and world_size > 1 else None
    bounds = mini_batch_bounds(
        rows, rows_per_mini_batch=rows_per_mini_batch, mini_batches=mini_batches, groups=groups
    )
    shares: list[list[list[int]]] = []  # [mini-batch][rank] -> rows
    for start, end in bounds:
        real = list(range(start, end))
        if groups is not None:
            shares.append(_group_shares(real, groups, lengths, world_size))
            continue
        # Padding to whole rows per rank: fewer than world_size rows, none on one rank.
        padded = real + [-1] * (-len(real) % world_size)
        share = len(padded) // world_size
        if balance_tokens and world_size > 1:
            tokens = [int(lengths[i]) if i >= 0 else 0 for i in padded]
            unit_of = None if prompts is None else [prompts[i] if i >= 0 else -1 for i in padded]
            shares.append(balanced_shares(padded, tokens, world_size, unit_of))
        else:
            shares.append([padded[r * share : (r + 1) * share] for r in range(world_size)])
    index: list[int] = []
    for rank in range(world_size):
        for m in range(len(bounds)):
            index += shares[m][rank]
    order = np.asarray(index)
    real_rows = order >= 0
    out = batch.select_idxs(np.where(real_rows, order, 0))
    pad = np.flatnonzero(~real_rows)
    if len(pad):
        out.batch["response_mask"][pad] = 0
    if groups is not None:
        import torch

        ids = [groups[i] if i >= 0 else -1 - at for at, i in enumerate(index)]
        out.batch["group_index"] = torch.tensor(ids, dtype=torch.int64)
    # A new dict: the caller's batch may share its meta_info with the result.
    out.meta_info = {**out.meta_info, "mini_batch_rows": [len(share[0]) for share in shares]}
    return out
