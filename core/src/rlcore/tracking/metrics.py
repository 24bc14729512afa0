"""Per-step metrics with verl's names, phase timers and throughput.

The trainer builds one flat ``dict[str, float]`` per step from these helpers and hands it to
``rlcore.tracking.Tracker.log``::

    timing: dict[str, float] = {}
    with timed("step", timing):
        with timed("gen", timing):
            gen = rollout.generate_sequences(batch)
        ...
    metrics = {**compute_data_metrics(batch), **timing_metrics(timing),
               **compute_throughput_metrics(batch, timing, n_workers=2)}

Only keys whose inputs are in the batch are produced, so one function serves GRPO (no values,
no returns) and PPO alike. torch is imported when a function runs, not at import.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

__all__ = [
    "Timer",
    "compute_data_metrics",
    "compute_throughput_metrics",
    "peak_rss_gb",
    "timed",
    "timing_metrics",
]


# --------------------------------------------------------------------------- memory


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, GiB (``perf/peak_rss_gb/<role>``).

    The kernel's high-water mark (``getrusage``), so a peak between two reports is not lost.
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1 << 30) if sys.platform == "darwin" else peak / (1 << 20)


# --------------------------------------------------------------------------- timing


class Timer:
    """Wall-clock seconds of a ``with`` block: ``with Timer() as t: ...; t.elapsed``."""

    def __init__(self) -> None:
        self.start = 0.0
        self.elapsed = 0.0

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.start


@contextmanager
def timed(name: str, timing: dict[str, float]) -> Iterator[Timer]:
    """Add the block's wall-clock seconds to ``timing[name]``.

    Adds rather than overwrites, so a phase split over several blocks in one step (e.g.
    ``update_actor`` over mini-batches) is counted once in full; the trainer starts a fresh
    dict each step. The time is recorded even when the block raises.
    """
    timer = Timer()
    try:
        with timer:
            yield timer
    finally:
        timing[name] = timing.get(name, 0.0) + timer.elapsed


def timing_metrics(timing: Mapping[str, float]) -> dict[str, float]:
    """``{"gen": 1.2}`` -> ``{"timing_s/gen": 1.2}``."""
    return {f"timing_s/{name}": float(seconds) for name, seconds in timing.items()}


# --------------------------------------------------------------------------- batch metrics


def _stats(prefix: str, values: torch.Tensor, *, extremes: bool = True) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.detach().float()
    out = {f"{prefix}/mean": values.mean().item()}
    if extremes:
        out[f"{prefix}/max"] = values.max().item()
        out[f"{prefix}/min"] = values.min().item()
    return out


def _response_mask(batch: DataProto) -> torch.Tensor | None:
    """(B, R) bool over response tokens, or None when the batch has no responses yet."""
    tensors = batch.batch
    if "response_mask" in tensors:
        return tensors["response_mask"].bool()
    if "responses" in tensors and "attention_mask" in tensors:
        width = tensors["responses"].shape[-1]
        return tensors["attention_mask"][:, -width:].bool()
    return None


def compute_data_metrics(batch: DataProto) -> dict[str, float]:
    """verl's data metrics for a batch after advantages were computed.

    Reads (when present) ``token_level_scores`` and ``token_level_rewards`` (B, R): summed per
    sequence -> ``critic/score/*`` and ``critic/rewards/*``; ``advantages``, ``returns``,
    ``values`` (B, R): means over response tokens -> ``critic/advantages/*``, ... plus
    ``critic/vf_explained_var`` with values; ``responses`` (B, R) with ``response_mask`` ->
    ``response_length/{mean,max,min,clip_ratio}`` (clip ratio: share of responses that hit
    the length limit R); ``attention_mask`` (B, P+R) -> ``prompt_length/{mean,max,min}``.
    """
    import torch

    tensors = batch.batch
    out: dict[str, float] = {}
    if "token_level_scores" in tensors:
        out |= _stats("critic/score", tensors["token_level_scores"].sum(-1))
    if "token_level_rewards" in tensors:
        out |= _stats("critic/rewards", tensors["token_level_rewards"].sum(-1))

    mask = _response_mask(batch)
    if mask is not None:
        for key, prefix in (
            ("advantages", "critic/advantages"),
            ("returns", "critic/returns"),
            ("values", "critic/values"),
        ):
            if key in tensors:
                out |= _stats(prefix, torch.masked_select(tensors[key], mask))
        if "returns" in tensors and "values" in tensors:
            returns = torch.masked_select(tensors["returns"], mask).float()
            values = torch.masked_select(tensors["values"], mask).float()
            if returns.numel() > 1:
                # 1 - Var(R - V) / Var(R): how much of the return's variance the critic explains
                var = torch.var(returns)
                out["critic/vf_explained_var"] = (
                    1.0 - torch.var(returns - values) / (var + 1e-5)
                ).item()
        response_length = mask.sum(-1).float()  # (B,)
        max_len = mask.shape[-1]
        out |= _stats("response_length", response_length)
        out["response_length/clip_ratio"] = (response_length == max_len).float().mean().item()
        if "attention_mask" in tensors:
            total = tensors["attention_mask"].sum(-1).float()  # (B,) prompt + response tokens
            prompt_length = total - tensors["attention_mask"][:, -max_len:].sum(-1).float()
            out |= _stats("prompt_length", prompt_length)
    elif "attention_mask" in tensors:
        out |= _stats("prompt_length", tensors["attention_mask"].sum(-1).float())
    return out


def compute_throughput_metrics(
    batch: DataProto, timing: Mapping[str, float], n_workers: int = 1
) -> dict[str, float]:
    """Tokens processed per second of the step (prompt + response tokens, padding excluded).

    ``perf/total_num_tokens``, ``perf/time_per_step`` (= ``timing["step"]``),
    ``perf/tokens_per_s`` (whole step) and ``perf/throughput`` (per worker, verl's name).
    Generation speed alone: ``perf/gen_tokens_per_s`` (response tokens / ``timing["gen"]``).
    """
    tensors = batch.batch
    out: dict[str, float] = {}
    if "attention_mask" not in tensors:
        return out
    total = float(tensors["attention_mask"].sum().item())
    out["perf/total_num_tokens"] = total
    step = timing.get("step", 0.0)
    if step > 0:
        out["perf/time_per_step"] = step
        out["perf/tokens_per_s"] = total / step
        out["perf/throughput"] = total / (step * max(n_workers, 1))
    mask = _response_mask(batch)
    gen = timing.get("gen", 0.0)
    if mask is not None and gen > 0:
        out["perf/gen_tokens_per_s"] = float(mask.sum().item()) / gen
    return out
