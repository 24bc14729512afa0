"""What every training engine needs besides its model: schedule, micro-batches, totals, skip.

A contract-only engine (:class:`rlcore.interfaces.BaseEngine`) builds its model and optimizer,
runs forward and backward, saves state and exports; the rest comes from here, so that every
engine normalises, schedules and skips the same way:

- :func:`learning_rate` — the LR schedule (formula in its docstring). The worker computes it
  and passes ``lr`` to ``optimizer_step``; it also logs it as ``actor/lr`` / ``critic/lr``.
- :func:`split_micro_batches` — micro-batches by row count or by a token budget.
- :func:`prompt_group_starts` — where runs of rows with the same prompt (one prompt's
  samples) start, for engines that run a shared prompt once.
- :func:`batch_totals` — :class:`~rlcore.interfaces.BatchTotals` over a mini-batch on all
  ranks (the denominators every loss divides by).
- :func:`clip_and_step` — clip, then step at ``lr`` unless the grad norm is non-finite.
- :func:`log_probs_from_logits` / :func:`entropy_from_logits` — float32, chunked over tokens
  so no float32 (B, T, vocab) tensor is materialised.
- :func:`rollout_tensors` — the output layout of every rollout's ``generate`` (HF, vLLM,
  SGLang, the agent loop), built in one place so it cannot drift between them.

torch is imported by the functions that need it, so the worker can import the schedule
without pulling in anything else.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rlcore.errors import ConfigError
from rlcore.interfaces import BatchTotals, OptimConfig

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

__all__ = [
    "LOG_PROB_CHUNK_TOKENS",
    "batch_totals",
    "clip_and_step",
    "entropy_from_logits",
    "learning_rate",
    "log_probs_from_logits",
    "lr_multiplier",
    "micro_batch_count",
    "prompt_group_starts",
    "rollout_tensors",
    "set_lr",
    "split_micro_batches",
]


# --- learning-rate schedule ------------------------------------------------------------------


def lr_multiplier(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Multiplier of the base LR for optimizer step ``step`` (0-based: steps already taken).

    With ``w = warmup_steps`` and ``T = total_steps``::

        step < w:        (step + 1) / w                      # linear warm-up, step 0 trains
        "constant":      1
        "cosine":        m + (1 - m) * (1 + cos(pi * p)) / 2,
                         p = min(1, (step - w) / max(1, T - 1 - w)),  m = min_lr_ratio

    so the cosine schedule starts at 1 right after warm-up and reaches ``min_lr_ratio`` at the
    last step, ``step = T - 1``, and stays there for any step beyond.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate(optim: OptimConfig, step: int, total_steps: int) -> float:
    """``optim.lr`` times :func:`lr_multiplier` at ``step`` of ``total_steps``."""
    return optim.lr * lr_multiplier(
        step,
        warmup_steps=optim.warmup_steps,
        total_steps=total_steps,
        schedule=optim.schedule,
        min_lr_ratio=optim.min_lr_ratio,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set ``lr`` on every parameter group (what ``optimizer_step(lr=...)`` does first)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


# --- micro-batches -----------------------------------------------------------------------------


def prompt_group_starts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """(b,) bool: True where a row's prompt differs from the previous row's.

    The prompt is the columns before the last ``response_length``; two prompts are the same
    when the same columns are valid and hold the same tokens (at the same ``position_ids``,
    where given), so a copy computed for one row is exactly what the other would compute.
    The driver lays out each prompt's ``n`` samples next to each other: each run is a group.
    """
    import torch

    p = input_ids.shape[1] - response_length
    starts = torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    if input_ids.shape[0] < 2 or p < 1:
        return starts
    valid = attention_mask[:, :p].bool()
    later = valid[1:]
    same = (valid[1:] == valid[:-1]).all(dim=1)
    same &= ((input_ids[1:, :p] == input_ids[:-1, :p]) | ~later).all(dim=1)
    if position_ids is not None and position_ids.dim() == 2:
        pos = position_ids[:, :p]
        same &= ((pos[1:] == pos[:-1]) | ~later).all(dim=1)
    starts[1:] = ~same
    return starts


def split_micro_batches(
    data: DataProto,
    *,
    micro_batch_size: int | None,
    max_tokens: int | None,
    packed: bool = False,
    share_prompts: bool = False,
) -> list[DataProto]:
    """Split ``data`` into contiguous micro-batches, keeping row order.

    By count: ``micro_batch_size`` rows each (the last may be shorter). By token budget
    (dynamic batching, ``max_tokens`` set): rows are packed greedily, in order, while the
    micro-batch's padded size ``rows * max(valid tokens of its rows)`` stays within
    ``max_tokens`` (``packed``: the sum of its rows' valid tokens, for an engine that runs a
    micro-batch padding-free; with ``share_prompts`` a row whose prompt the row before in the
    same micro-batch shares counts its response only, as the engine runs that prompt once);
    a single row longer than the budget gets a micro-batch of its own. Contiguous packing
    keeps the order, so outputs concatenate back without a permutation.
    """
    n = len(data)
    if n == 0:
        return []
    if max_tokens is not None:
        if max_tokens < 1:
            msg = f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}"
            raise ConfigError(msg)
        mask = data.batch["attention_mask"]
        lengths = mask.sum(dim=-1).tolist()  # (B,) valid tokens per row
        # Tokens a row adds after a row with the same prompt (shared: its response only).
        following = lengths
        shares = (
            packed and share_prompts and "responses" in data.batch and "input_ids" in data.batch
        )
        if shares:
            r = data.batch["responses"].shape[1]
            continues = (~prompt_group_starts(data.batch["input_ids"], mask, r)).tolist()
            response_tokens = mask[:, mask.shape[1] - r :].sum(dim=-1).tolist()
            following = [
                resp if c else full
                for resp, c, full in zip(response_tokens, continues, lengths, strict=True)
            ]
        bounds, start, longest, total = [], 0, 0, 0
        for i, length in enumerate(lengths):
            added = int(following[i]) if i > start else int(length)
            longest_with, total_with = max(longest, int(length)), total + added
            size = total_with if packed else (i - start + 1) * longest_with
            if i > start and size > max_tokens:
                bounds.append((start, i))
                start, longest_with, total_with = i, int(length), int(length)
            longest, total = longest_with, total_with
        bounds.append((start, n))
        return [data.slice(a, b) for a, b in bounds]
    if micro_batch_size is None or micro_batch_size < 1:
        msg = (
            "set exactly one of micro_batch_size (>= 1) or max_tokens_per_micro_batch "
            f"for the engine; got micro_batch_size={micro_batch_size}"
        )
        raise ConfigError(msg)
    count = math.ceil(n / micro_batch_size)
    return [
        data.slice(i * micro_batch_size, min(n, (i + 1) * micro_batch_size)) for i in range(count)
    ]


def micro_batch_count(local: int, device: torch.device | None = None) -> int:
    """The largest number of micro-batches over ranks (1 rank, or no process group: ``local``).

    Ranks with fewer micro-batches (token budgets differ per rank) run zero-weight passes
    up to this count, so every rank issues the same collectives (FSDP all-gathers).
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    count = torch.tensor([local], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


# --- log-probs ---------------------------------------------------------------------------------

# Response tokens per chunk of the float32 log-softmax: (chunk, V) float32 temporaries, e.g.
# 1024 x 152k x 4 B = 620 MB for Qwen2.5, instead of (b * R, V) for the whole micro-batch.
LOG_PROB_CHUNK_TOKENS = 1024


def _chunk_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) of one (n, V) chunk in float32 -> (n,)."""
    import torch

    chunk = logits.float()
    picked = torch.gather(chunk, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(chunk, dim=-1)


def _chunk_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax over one (n, V) chunk in float32 -> (n,)."""
    import torch

    chunk = logits.float()
    probs = torch.softmax(chunk, dim=-1)
    return torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1)


def _chunked(
    fn: Any, tensors: list[torch.Tensor], chunk_tokens: int | None, *, recompute: bool
) -> torch.Tensor:
    """``fn`` over row chunks of ``tensors``, concatenated.

    ``torch.split``, not slicing: the backward of a slice allocates a full-size zero
    gradient per chunk, the split's one concatenation. ``recompute``: under grad, run each
    chunk under activation checkpointing, so what ``fn`` saves for backward (a float32
    copy of bf16 logits, softmax probabilities) lives one chunk at a time.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    n = tensors[0].shape[0]
    if chunk_tokens is None or n <= chunk_tokens:
        return fn(*tensors)  # type: ignore[no-any-return]
    grad = recompute and torch.is_grad_enabled() and tensors[0].requires_grad
    parts = []
    for args in zip(*(torch.split(t, chunk_tokens) for t in tensors), strict=True):
        parts.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return torch.cat(parts)


def entropy_from_logits(
    logits: torch.Tensor, *, chunk_tokens: int | None = LOG_PROB_CHUNK_TOKENS
) -> torch.Tensor:
    """Entropy of softmax(logits) over the vocabulary, float32, chunked: (b, R, V) -> (b, R)."""
    b, r, v = logits.shape
    flat = [logits.reshape(b * r, v)]
    return _chunked(_chunk_entropy, flat, chunk_tokens, recompute=True).reshape(b, r)


def log_probs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int | None = LOG_PROB_CHUNK_TOKENS,
) -> torch.Tensor:
    """log p(label) for (b, R, V) logits (any float dtype) and (b, R) labels -> (b, R) float32.

    Memory-lean: the float32 upcast, ``exp`` and ``logsumexp`` run over ``chunk_tokens``
    tokens at a time, so no float32 (b, R, V) tensor exists at once. With gradient, each
    chunk of lower-precision logits is recomputed in the backward pass (activation
    checkpointing) instead of keeping its float32 copy; only the logits themselves are saved.
    float32 logits with gradient take one chunk (no copy to save). ``chunk_tokens=None``: one
    chunk (the plain path). Exact: the same float32 arithmetic per token either way.
    """
    import torch

    b, r, v = logits.shape
    flat = [logits.reshape(b * r, v), labels.reshape(b * r)]
    if logits.dtype == torch.float32 and torch.is_grad_enabled() and logits.requires_grad:
        # Nothing to save: no upcast copy exists, and chunking under grad only adds the
        # chunk gradients' concatenation (measured: higher peak, benchmarks/logprob_memory.py).
        chunk_tokens = None
    return _chunked(_chunk_log_probs, flat, chunk_tokens, recompute=True).reshape(b, r)


# --- totals ------------------------------------------------------------------------------------


def batch_totals(batch: DataProto, device: torch.device | None = None) -> BatchTotals:
    """:class:`BatchTotals` of this rank's share of a mini-batch, summed over all ranks.

    ``tokens``: valid response tokens; ``sequences``: rows with at least one valid token
    (the driver's padding rows have none); ``max_response_length``: the largest R. Collective
    when a process group of more than one rank exists: every rank must call it.
    """
    import torch
    import torch.distributed as dist

    mask = batch.batch["response_mask"]
    per_row = mask.sum(-1)
    sums = torch.tensor(
        [int(per_row.sum().item()), int((per_row > 0).sum().item())],
        dtype=torch.int64,
        device=device,
    )
    longest = torch.tensor([mask.shape[1]], dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    return BatchTotals(
        tokens=int(sums[0]), sequences=int(sums[1]), max_response_length=int(longest[0])
    )


# --- the optimizer step ------------------------------------------------------------------------


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[torch.Tensor],
    *,
    lr: float,
    max_norm: float,
) -> float:
    """Clip to ``max_norm`` (<= 0: no clipping), step at ``lr``, zero grads; the grad norm.

    A non-finite norm (a NaN/inf loss or gradient) skips the step: the gradients are zeroed
    and the optimizer state is untouched, and the norm is returned as is for the caller to
    report. Works for FSDP2's DTensor norms (reduced to a plain number here).
    """
    import torch

    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm if max_norm > 0 else math.inf)
    full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP2
    grad_norm = float(full() if callable(full) else norm)
    if math.isfinite(grad_norm):
        set_lr(optimizer, lr)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


# --- the rollout output layout ------------------------------------------------------------
# The output tensors of :class:`~rlcore.interfaces.BaseRollout.generate`, built in one place.
#
# Every rollout (HF, vLLM, SGLang) and the agent loop produce the same layout from left-padded
# prompts and right-padded responses; this module is that layout, so it cannot drift between
# them. torch is imported by the function (plugin discovery imports nothing heavy).


def rollout_tensors(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_pos: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    log_probs: torch.Tensor | None = None,
    response_attention: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``prompts``, ``responses``, ``response_mask``, ``input_ids``, ``attention_mask``,
    ``position_ids`` (and ``rollout_log_probs`` when ``log_probs`` is given, 0 where
    ``response_mask`` is 0).

    ``prompt_*`` are (B, P), ``responses``/``response_mask`` (B, R). The responses' attention
    is ``response_mask`` unless ``response_attention`` says otherwise (the agent loop attends
    to tool turns that get no loss). Response positions continue from the last prompt
    position, also past EOS, where they are masked.
    """
    import torch

    attended = response_mask if response_attention is None else response_attention
    r = responses.shape[1]
    delta = torch.arange(1, r + 1, dtype=prompt_pos.dtype).unsqueeze(0)  # (1, R)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, attended.to(prompt_mask.dtype)], dim=1),
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + delta], dim=1),
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = log_probs * response_mask
    return tensors
