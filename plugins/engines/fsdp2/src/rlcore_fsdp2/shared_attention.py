"""Attention over a shared-prompt packed sequence in a few batched ``sdpa`` calls.

The packed layout (:mod:`rlcore_fsdp2.packing`) is, per group, ``[prompt, response_1, ...,
response_n]``: each prompt attends causally to itself, each response to its group's whole
prompt and causally to itself. Run as one ``sdpa`` per segment, a GRPO micro-batch of 16
prompts x 8 samples is 144 small calls per layer (each with its own autograd and checkpoint
bookkeeping, and a concatenated copy of the prompt's keys). Here the segments are gathered
into padded blocks instead, and each block is one call:

- the prompts, as (G, H, P, D) rows with a causal mask that also hides each row's padding;
- the responses, as (B, H, R, D) queries over (B, H_kv, P + R, D) keys and values: the row's
  group prompt (gathered, so a prompt's key is read by all its rows and its gradient sums
  over them, as with a copy per row), then the row's own response, causally. Grouped-query
  heads are not repeated: ``sdpa``'s ``enable_gqa``.

Measured on CPU, one thread, the actor's forward+backward (gradient checkpointing on) of a
16 x 8 micro-batch, best of 8 steps per process, interleaved processes, median (range):
``benchmarks/vs_trl.py``'s dense model (2 layers, 50-token prompts, 60-token responses)
0.54 s (0.50-0.66, 9 processes) against 0.65 s (0.55-0.78, 6) one call per segment; the
quickstart's model (4 layers, 35 + 22 tokens) 0.54 s (0.49-0.65, 9) against 0.70 s
(0.55-0.77, 6).

Padded query positions see one valid key (no all-masked row: no NaN) and their outputs are
dropped; every packed position is written by exactly one output, read back by one gather.
Blocks are cut between groups so a block's gathered keys stay under
:data:`BLOCK_KEY_TOKENS` x heads x head size elements (the memory a padded micro-batch's
keys would take, bounded).
"""

from __future__ import annotations

import functools

import attrs
import torch

__all__ = ["BLOCK_KEY_TOKENS", "PromptGroups", "shared_prompt_attention"]

# Gathered key tokens (rows x padded prompt+response) per block: bounds the transient copy.
BLOCK_KEY_TOKENS = 1 << 16

# Per group: the prompt's token count and each row's response count, in packed order.
PromptGroups = tuple[tuple[int, tuple[int, ...]], ...]


@attrs.frozen
class _Call:
    """One batched ``sdpa``: rows of queries and keys gathered from the packed (N,) sequence."""

    query_index: torch.Tensor  # (rows, Lq) packed positions (0 on padding)
    key_index: torch.Tensor  # (rows, Lk)
    mask: torch.Tensor  # (rows, 1, Lq, Lk) additive
    # Which padded outputs, flattened row-major, are real tokens (integer indices: boolean
    # indexing would synchronize with a GPU).
    valid: torch.Tensor  # (tokens,) into rows * Lq


@attrs.frozen
class _Layout:
    calls: tuple[_Call, ...]  # per block: its prompts' call, then its responses' call
    source: torch.Tensor  # (N,): packed position n's output is row source[n] of the blocks'


def shared_prompt_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    groups: PromptGroups,
    dropout: float,
    scaling: float | None,
) -> tuple[torch.Tensor, None]:
    """(1, H, N, D) query, (1, H_kv, N, D) key/value -> (1, N, H, D), as transformers'
    attention functions return (``H`` a multiple of ``H_kv``)."""
    layout = _layout(groups, query.dtype, query.device)
    q, k, v = query[0], key[0], value[0]  # (H, N, D)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # Grouped-query attention: sdpa reads each K/V head for its query heads (no copies).
    gqa = key.shape[1] != query.shape[1]
    outs = []
    for call in layout.calls:
        out = sdpa(
            _gather(q, call.query_index),
            _gather(k, call.key_index),
            _gather(v, call.key_index),
            attn_mask=call.mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=gqa,
        )  # (rows, H, Lq, D)
        outs.append(_valid_tokens(out, call.valid))
    tokens = outs[0] if len(outs) == 1 else torch.cat(outs)  # (N, H, D), in block order
    return tokens.index_select(0, layout.source).unsqueeze(0), None


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(H, N, D) at (rows, L) packed positions -> (rows, H, L, D)."""
    rows, length = index.shape
    picked = x.index_select(1, index.reshape(-1))  # (H, rows * L, D)
    return picked.view(x.shape[0], rows, length, x.shape[2]).transpose(0, 1)


def _valid_tokens(out: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(rows, H, L, D) -> (valid tokens, H, D), row-major."""
    rows, heads, length, dim = out.shape
    flat = out.transpose(1, 2).reshape(rows * length, heads, dim)
    return flat.index_select(0, valid)


@functools.lru_cache(maxsize=8)
def _layout(groups: PromptGroups, dtype: torch.dtype, device: torch.device) -> _Layout:
    """The batched calls for ``groups``, block by block, and the map back to packed order.

    Built once per micro-batch (every layer, and the checkpoint recompute, reuse it).
    """
    starts, at = [], 0  # each group's packed start
    for prompt, rows in groups:
        starts.append(at)
        at += prompt + sum(rows)
    calls: list[_Call] = []
    written: list[torch.Tensor] = []  # packed positions in the order outputs are produced
    lo = 0
    while lo < len(groups):
        hi, rows_in, pmax, rmax = lo, 0, 0, 0
        while hi < len(groups):  # grow the block while its keys fit (one group at least)
            prompt, rows = groups[hi]
            live = sum(1 for n in rows if n)
            p, r = max(pmax, prompt), max([rmax, *rows])
            if hi > lo and (rows_in + live) * (p + r) > BLOCK_KEY_TOKENS:
                break
            rows_in, pmax, rmax, hi = rows_in + live, p, r, hi + 1
        for call, positions in _block(groups[lo:hi], starts[lo:hi], dtype, device):
            calls.append(call)
            written.append(positions)
        lo = hi
    order = torch.cat(written) if written else torch.zeros(0, dtype=torch.long)
    source = torch.empty(at, dtype=torch.long)
    source[order] = torch.arange(at)
    return _Layout(calls=tuple(calls), source=source.to(device))


def _block(
    groups: PromptGroups, starts: list[int], dtype: torch.dtype, device: torch.device
) -> list[tuple[_Call, torch.Tensor]]:
    """A block's calls on ``device`` (its prompts, then its responses; none where there are
    none), each with the packed positions (CPU) its valid outputs cover, in order."""
    neg = torch.finfo(dtype).min  # additive mask: finite, so a 0 * -inf never makes a NaN
    prompted = [(s, p) for (p, _), s in zip(groups, starts, strict=True) if p > 0]
    rows = []  # (group start, prompt, response start, response length) of each live row
    for (prompt, lengths), start in zip(groups, starts, strict=True):
        at = start + prompt
        for n in lengths:
            if n:
                rows.append((start, prompt, at, n))
            at += n
    calls = []
    if prompted:  # causal over each prompt; padding hidden (a padded query still sees key 0)
        j = torch.arange(max(p for _, p in prompted))
        s, p = (torch.tensor(c).unsqueeze(1) for c in zip(*prompted, strict=True))
        valid = j < p  # (G, P)
        index = torch.where(valid, s + j, 0)
        seen = (j.view(1, 1, -1) <= j.view(1, -1, 1)) & valid.unsqueeze(1)  # (G, P, P)
        calls.append((index, index, seen, valid))
    if rows:  # the group's whole prompt, then the row's response causally
        gs, pl, rs, rl = (torch.tensor(c).unsqueeze(1) for c in zip(*rows, strict=True))
        pmax, rmax = int(pl.max()), int(rl.max())
        jp, jr = torch.arange(pmax), torch.arange(rmax)
        prompt_ok, query_ok = jp < pl, jr < rl  # (B, P), (B, R)
        query_index = torch.where(query_ok, rs + jr, 0)
        key_index = torch.cat([torch.where(prompt_ok, gs + jp, 0), query_index], dim=1)
        causal = jr.view(1, 1, -1) <= jr.view(1, -1, 1)  # (1, R, R): key <= query
        seen = torch.cat(
            [prompt_ok.unsqueeze(1).expand(-1, rmax, -1), causal & query_ok.unsqueeze(1)], dim=2
        )  # (B, R, P + R)
        seen[:, :, pmax] |= ~query_ok  # a padded query sees its row's first response token
        calls.append((query_index, key_index, seen, query_ok))
    out = []
    for query_index, key_index, seen, valid in calls:
        flat = valid.reshape(-1).nonzero().squeeze(1)
        mask = torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, neg).unsqueeze(1)
        call = _Call(
            query_index=query_index.to(device),
            key_index=key_index.to(device),
            mask=mask.to(device),
            valid=flat.to(device),
        )
        out.append((call, query_index.reshape(-1)[flat]))
    return out
