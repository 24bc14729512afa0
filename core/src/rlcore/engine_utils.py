"""What every training engine needs besides its model: schedule, micro-batches, totals, skip.

A contract-only engine (:class:`rlcore.interfaces.BaseEngine`) builds its model and optimizer,
runs one micro-batch forward, saves state and exports; the rest comes from here, so that every
engine normalises, schedules and skips the same way:

- :func:`init_device` — this process's device, the default process group, seed and threads;
  :func:`dtype_from_name` — the torch dtype of a config's ``dtype`` name.
- :func:`accumulate_gradients` — the micro-batch loop of ``forward_backward`` around the
  engine's own forward (totals, loss scaling, token-weighted metric means, zero-weight
  passes); :func:`forward_micro_batches` — the same loop without gradient, for
  ``compute_log_prob``/``compute_values``. :class:`MetricMeans` and :func:`token_weight` are
  its parts, for an engine whose framework runs the loop itself (megatron's schedule).
- :class:`OptimizerGuard` — ``optimizer_step``: grad norm, clip, skip a non-finite step,
  count steps and skips.
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

import logging
import math
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.errors import ConfigError, EngineError
from rlcore.interfaces import (
    DTYPE_NAMES,
    BatchTotals,
    EngineSpec,
    LossFn,
    ModelOutputs,
    OptimConfig,
)

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = [
    "LOG_PROB_CHUNK_TOKENS",
    "TOKENIZER_FILES",
    "GuardedSteps",
    "MetricMeans",
    "OptimizerGuard",
    "accumulate_gradients",
    "batch_totals",
    "clip_and_step",
    "clip_grad_norm",
    "copy_tokenizer_files",
    "dtype_from_name",
    "entropy_from_logits",
    "forward_micro_batches",
    "init_device",
    "learning_rate",
    "local_device_index",
    "log_probs_from_logits",
    "lr_multiplier",
    "micro_batch_count",
    "prompt_group_starts",
    "rollout_tensors",
    "set_lr",
    "split_micro_batches",
    "token_weight",
]


# --- dtypes and devices ------------------------------------------------------------------------


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a config ``dtype`` name (``model.dtype``, ``EngineSpec.dtype``, ...).

    The one table of the names in :data:`rlcore.interfaces.DTYPE_NAMES`: ``"float32"``,
    ``"bfloat16"``, ``"float16"``.
    """
    import torch

    if name not in DTYPE_NAMES:
        msg = f"unknown dtype {name!r}; choose from {', '.join(DTYPE_NAMES)}"
        raise ConfigError(msg)
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def local_device_index(local_rank: int, device_count: int) -> int:
    """The CUDA device of this process, as the worker base picks it.

    Ray narrows ``CUDA_VISIBLE_DEVICES`` to the actor's own GPU, so a worker with
    ``LOCAL_RANK=1`` sees one device, index 0; a launcher that shows every GPU to every
    process (torchrun) gets ``LOCAL_RANK``.
    """
    return local_rank % max(1, device_count)


def init_device(
    device: str, *, seed: int | None = None, num_threads: int | None = None
) -> torch.device:
    """This process's device; joins (or creates) the default process group; seeds; threads.

    ``device`` is ``EngineSpec.device``: ``"cuda"`` selects this process's GPU
    (:func:`local_device_index`), ``"cpu"`` the CPU. A worker has initialised the group already
    (env ``MASTER_ADDR``/``RANK``/``WORLD_SIZE``); otherwise a launcher's env is used when
    present, else a private 1-rank group (an engine built in a test or a notebook).
    ``seed``: ``torch.manual_seed`` (all devices) when given, e.g. so that a freshly initialised
    value head is the same on every rank. ``num_threads``: torch's intra-op threads when given
    (a worker has pinned them to its CPU share already; None leaves them as they are).
    """
    import torch
    import torch.distributed as dist

    if device == "cuda":
        if not torch.cuda.is_available():
            msg = "device = 'cuda' but torch sees no CUDA device; use device = 'cpu'"
            raise ConfigError(msg)
        torch.cuda.set_device(
            local_device_index(int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count())
        )
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, device_id=dev if dev.type == "cuda" else None)
        else:
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
        log.info("initialised a %s process group of %d rank(s)", backend, dist.get_world_size())
    if seed is not None:
        torch.manual_seed(seed)
    if num_threads is not None and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
    return dev


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


def batch_totals(
    batch: DataProto,
    device: torch.device | None = None,
    group: dist.ProcessGroup | None = None,
) -> BatchTotals:
    """:class:`BatchTotals` of this rank's share of a mini-batch, summed over all ranks.

    ``tokens``: valid response tokens; ``sequences``: rows with at least one valid token
    (the driver's padding rows have none); ``max_response_length``: the largest R. Collective
    when a process group of more than one rank exists: every rank must call it. ``group``:
    sum over this group only (an engine whose tensor/pipeline-parallel ranks share rows sums
    over its data-parallel group); None: the default group.
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
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(sums, group=group)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    return BatchTotals(
        tokens=int(sums[0]), sequences=int(sums[1]), max_response_length=int(longest[0])
    )


# --- export ------------------------------------------------------------------------------------

# What ``export_hf`` copies from ``model_path`` next to the weights it writes.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def copy_tokenizer_files(
    source: str | Path, out: str | Path, names: Iterable[str] = TOKENIZER_FILES
) -> None:
    """Copy the files ``names`` that ``source`` (the base model folder) has into ``out``."""
    for name in names:
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, Path(out) / name)


# --- the micro-batch loop ----------------------------------------------------------------------

# What a micro-batch weighs in the metric means when it has no valid response token (only
# driver padding rows): nothing, without a division by zero when every micro-batch is such.
_EMPTY_WEIGHT = 1e-9


def token_weight(micro_batch: DataProto) -> float:
    """A micro-batch's weight in the metric means: its valid response tokens."""
    return float(micro_batch.batch["response_mask"].sum().item()) or _EMPTY_WEIGHT


class MetricMeans:
    """Means of micro-batch metrics weighted by :func:`token_weight` (what ``forward_backward``
    returns): ``sum_i w_i * m_i / sum_i w_i`` per key, in float64."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weight = 0.0

    def add(self, metrics: Mapping[str, float], weight: float) -> None:
        for key, value in metrics.items():
            self._sums[key] = self._sums.get(key, 0.0) + float(value) * weight
        self._weight += weight

    def result(self) -> dict[str, float]:
        """The means; empty when nothing was added (a pipeline stage without the loss)."""
        return {key: value / self._weight for key, value in self._sums.items()}


def _to_device(mb: DataProto, device: torch.device | None) -> DataProto:
    """A shallow copy of ``mb`` with its tensors on ``device`` (the caller's batch untouched)."""
    if device is None or device.type == "cpu":
        return mb
    from rlcore.protocol import DataProto

    return DataProto(
        batch=dict(mb.batch), non_tensor_batch=mb.non_tensor_batch, meta_info=mb.meta_info
    ).to(device)


def _plan(
    batch: DataProto,
    spec: EngineSpec,
    device: torch.device | None,
    *,
    packed: bool,
    share_prompts: bool,
    match_ranks: bool,
) -> tuple[list[DataProto], int]:
    """This rank's micro-batches and how many passes to run (the largest count over ranks
    with ``match_ranks``, else as many as there are micro-batches)."""
    if len(batch) == 0:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        msg = f"[{spec.role}] rank {rank} got an empty batch"
        raise EngineError(msg)
    mbs = split_micro_batches(
        batch,
        micro_batch_size=spec.micro_batch_size,
        max_tokens=spec.max_tokens_per_micro_batch,
        packed=packed,
        share_prompts=share_prompts,
    )
    return mbs, micro_batch_count(len(mbs), device) if match_ranks else len(mbs)


def _zero_loss(outputs: ModelOutputs) -> torch.Tensor:
    """A loss of value 0 that still runs the backward's collectives (a zero-weight pass)."""
    tensor = outputs.values if outputs.values is not None else outputs.log_probs
    if tensor is None:
        msg = "a forward returned ModelOutputs with neither log_probs nor values"
        raise EngineError(msg)
    return tensor.sum() * 0.0


def accumulate_gradients(
    batch: DataProto,
    loss_fn: LossFn,
    forward: Callable[[DataProto], ModelOutputs],
    *,
    spec: EngineSpec,
    device: torch.device | None = None,
    loss_scale: float = 1.0,
    packed: bool = False,
    share_prompts: bool = False,
    match_ranks: bool = False,
) -> dict[str, float]:
    """The body of :meth:`~rlcore.interfaces.BaseEngine.forward_backward` around ``forward``.

    ``forward(micro_batch)`` is the engine's own: one micro-batch (tensors on ``device``)
    through the model, with gradient, returning its (b, R) :class:`ModelOutputs`. Around it:

    1. :func:`batch_totals` of the whole ``batch`` (collective over all ranks);
    2. :func:`split_micro_batches` by ``spec.micro_batch_size`` or
       ``spec.max_tokens_per_micro_batch`` (``packed``/``share_prompts``: how the engine
       counts a token budget); an empty ``batch`` is an :class:`~rlcore.errors.EngineError`;
    3. per micro-batch: ``loss, metrics = loss_fn(outputs, micro_batch, totals)``, then
       ``(loss * loss_scale).backward()`` (``loss_scale``: e.g. the data-parallel size, for a
       wrapper that averages gradients over ranks while the loss is normalised globally);
    4. ``match_ranks``: a rank with fewer micro-batches than another (token budgets split
       differently per rank) runs zero-weight passes on its first row until the counts
       agree, so every rank issues the same collectives (FSDP's all-gathers);

    and returns the metrics averaged over micro-batches weighted by their valid response
    tokens (:class:`MetricMeans`; a micro-batch of padding rows weighs nothing). Rows the
    trainer left out for a zero advantage never reach the engine; the loss still divides by
    the totals of the whole mini-batch (:mod:`rlcore.trainer.levers`).
    """
    totals = batch_totals(batch, device)
    mbs, passes = _plan(
        batch, spec, device, packed=packed, share_prompts=share_prompts, match_ranks=match_ranks
    )
    means = MetricMeans()
    for i in range(passes):
        real = i < len(mbs)
        mb = _to_device(mbs[i] if real else batch.slice(0, 1), device)
        outputs = forward(mb)
        if real:
            loss, metrics = loss_fn(outputs, mb, totals)
            means.add(metrics, token_weight(mb))
        else:
            loss = _zero_loss(outputs)
        if loss_scale != 1.0:  # x 1.0 is exact either way; skipping it keeps the graph small
            loss = loss * loss_scale
        loss.backward()
    return means.result()


def forward_micro_batches(
    batch: DataProto,
    forward: Callable[[DataProto], ModelOutputs],
    *,
    spec: EngineSpec,
    device: torch.device | None = None,
    packed: bool = False,
    share_prompts: bool = False,
    match_ranks: bool = False,
) -> ModelOutputs:
    """``forward`` over ``batch``'s micro-batches without gradient; outputs joined, on CPU.

    The inference twin of :func:`accumulate_gradients` (same split, same zero-weight passes
    with ``match_ranks``): each (B, R) field of the result is the concatenation over
    micro-batches of the fields every micro-batch's ``forward`` filled (None otherwise).
    """
    import torch

    mbs, passes = _plan(
        batch, spec, device, packed=packed, share_prompts=share_prompts, match_ranks=match_ranks
    )
    outs = []
    with torch.no_grad():
        for i in range(passes):
            out = forward(_to_device(mbs[i] if i < len(mbs) else batch.slice(0, 1), device))
            if i < len(mbs):
                outs.append(out)

    def joined(field: str) -> torch.Tensor | None:
        parts = [getattr(o, field) for o in outs]
        if any(part is None for part in parts):
            return None
        return torch.cat(parts).cpu()

    return ModelOutputs(
        log_probs=joined("log_probs"), entropy=joined("entropy"), values=joined("values")
    )


# --- the optimizer step ------------------------------------------------------------------------


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> float:
    """The global grad norm of ``parameters`` (before clipping); clips to ``max_norm`` (<= 0:
    no clipping). Works for FSDP2's DTensor norms (reduced to a plain number here)."""
    import torch

    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm if max_norm > 0 else math.inf)
    full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP2
    return float(full() if callable(full) else norm)


class OptimizerGuard:
    """The body of :meth:`~rlcore.interfaces.BaseEngine.optimizer_step`, with its counters.

    :meth:`step` takes the grad norm (and clips to ``spec.grad_clip``), steps the optimizer
    at the ``lr`` the worker passed unless the norm is non-finite (a NaN/inf loss or
    gradient: the step is skipped, counted and logged, and the optimizer state is
    untouched), and zeroes the gradients either way. ``global_step`` counts steps taken,
    ``skipped_steps`` steps skipped, ``lr`` is the rate of the last step taken (0 before
    any); :meth:`state_dict` holds the counters for the engine's checkpoint. A run that
    diverges with a finite norm is the trainer's to stop (``trainer.grad_norm_ceiling``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, role: str, max_norm: float) -> None:
        self.optimizer = optimizer
        self.role = role
        self.max_norm = max_norm
        self.global_step = 0
        self.skipped_steps = 0
        self.lr = 0.0

    def step(
        self,
        *,
        lr: float,
        parameters: Iterable[torch.Tensor] | None = None,
        clip: Callable[[float], float] | None = None,
    ) -> float:
        """Clip, step at ``lr`` unless non-finite, zero grads; returns the grad norm.

        The norm is :func:`clip_grad_norm` of ``parameters`` (default: every parameter the
        optimizer holds), or ``clip(max_norm)`` for an engine whose gradients are sharded in
        a way torch's clipping does not know (it clips in place and returns the global norm
        before clipping; ``max_norm`` is ``inf`` when clipping is off).
        """
        if clip is not None:
            grad_norm = clip(self.max_norm if self.max_norm > 0 else math.inf)
        else:
            if parameters is None:
                parameters = [p for g in self.optimizer.param_groups for p in g["params"]]
            grad_norm = clip_grad_norm(parameters, self.max_norm)
        if math.isfinite(grad_norm):
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self.lr = lr
            self.global_step += 1
        else:
            self.skipped_steps += 1
            log.warning(
                "[%s] grad norm is %s at step %d: update skipped",
                self.role,
                grad_norm,
                self.global_step,
            )
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def state_dict(self) -> dict[str, int]:
        return {"global_step": self.global_step, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_step = int(state["global_step"])
        self.skipped_steps = int(state["skipped_steps"])


class GuardedSteps:
    """The optimizer side every engine that steps through an :class:`OptimizerGuard` shares.

    A mixin before :class:`~rlcore.interfaces.BaseEngine` in an engine's bases; the engine
    sets ``self._guard`` when it builds its optimizer and leaves it None without one (the
    reference, or no ``optim``). ``global_step``, ``skipped_steps`` and ``lr`` are the
    guard's counters (0 without one); :meth:`_require_guard` is the check a training call
    starts with.
    """

    spec: EngineSpec
    _guard: OptimizerGuard | None = None

    @property
    def global_step(self) -> int:
        """Optimizer steps taken."""
        return self._guard.global_step if self._guard is not None else 0

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite grad norm."""
        return self._guard.skipped_steps if self._guard is not None else 0

    @property
    def lr(self) -> float:
        """The learning rate of the last optimizer step (0 before any)."""
        return self._guard.lr if self._guard is not None else 0.0

    def _require_guard(self, error: type[EngineError]) -> OptimizerGuard:
        """The guard, or ``error`` (the engine's own class) for an engine that cannot train."""
        if self._guard is None:
            msg = f"[{self.spec.role}] engine has no optimizer (role 'ref' or optim unset)"
            raise error(msg)
        return self._guard


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
    report. :class:`OptimizerGuard` is the same step with counters and a log line.
    """
    grad_norm = clip_grad_norm(parameters, max_norm)
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
