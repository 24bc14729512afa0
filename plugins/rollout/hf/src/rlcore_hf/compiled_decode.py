"""The HF rollout's decoding with a ``torch.compile``d one-token step over a static KV cache.

Why: on a CPU a decoding step of a small model is mostly per-op cost, not arithmetic: eager
mode runs ~1,100 ATen ops per step for the quickstart's 4-layer model (norms, rotary
embeddings, the mask, each a handful of ops), and ``generate`` adds its own Python around each
step. Compiled by inductor, the step is its matmuls, the attention kernel and a few fused C++
loops (the ``rollout.compile_decode`` key). Measured with ``benchmarks/rollout.py`` on the
2-core machine under heavy load from other work (interleaved rounds, one thread), 64 sampled
tokens on the quickstart model: tokens per CPU second 2.0x eager's at 8 rows and 1.5x at 64
rows (wall 2.1x and 1.6x). Eager mode spent 2 ms of 9 ms per step (8 rows) in transformers'
``generate`` around the forward and most of the rest in per-op dispatch; the compiled step
is left with its matmuls, the attention and ~1 ms of guard checks per call.

The compile costs ~20-40 s of CPU per shape in a fresh process (~3.5-5 s once inductor's
on-disk cache holds it). On a CPU the rollout does not wait for it: a new shape compiles in a
child process into that cache (:mod:`rlcore_hf.compile_warmup`, ``rollout.compile_in_background``)
while the calls decode with ``generate``, and the rollout then loads it in seconds
(:meth:`CompiledDecoder.ready`).

How: transformers' :class:`~transformers.StaticCache` keeps every layer's keys and values in
buffers of a fixed shape, ``(rows, kv_heads, length, head_dim)``, written in place at the
cache's own position counter, so the step sees the same shapes at every token and compiles
once per ``(rows, length)``. Rows are padded up to a power of two (at least 8) and the length
(prompt width + ``max_new_tokens``) up to a multiple of 64, and one cache per such shape is
kept for the next call (its buffers are marked as static addresses for the compiler; the memory
they hold, rows x layers x 2 x length x kv_heads x head_dim, stays with the rollout). The bound:
one graph per row bucket and length bucket met, at most ``_MAX_GRAPHS`` (torch's recompile
limit is raised to it while a new shape compiles; past it torch runs the step eagerly, and says
so in a warning).

The prompt is prefilled eagerly, each distinct prompt once (the shared prefill's idea,
:mod:`rlcore_hf.shared_prefill`), into a ``DynamicCache``; its keys and values are then copied
to every row of the static cache. The loop is ``generate``'s greedy/sampling loop reduced to
what the rollout uses: the first token from the prefill's logits, then one compiled step per
token; a row that emitted an EOS emits ``pad_token_id`` after it; the loop ends when every row
has ended or after ``max_new_tokens``. Draws use the same processors, in the same order, on the
real rows only, so the random stream is ``generate``'s.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import torch

from rlcore.interfaces import SamplingParams

if TYPE_CHECKING:
    from rlcore_hf.compile_warmup import WarmupProcess, WarmupSpec

__all__ = ["DECODE_ATTENTION", "CompiledDecoder", "attention_for_compiled_decode"]

log = logging.getLogger(__name__)

_MIN_ROWS = 8
_LENGTH_STEP = 64
_MAX_GRAPHS = 16
DECODE_ATTENTION = "rlcore_decode_sdpa"


def _bucket_rows(rows: int) -> int:
    return max(_MIN_ROWS, 1 << (rows - 1).bit_length())


def _bucket_length(length: int) -> int:
    return -(-length // _LENGTH_STEP) * _LENGTH_STEP


class CompiledDecoder:
    """Decodes for one HF model; owns its compiled step and its static caches."""

    def __init__(self, model: Any, warmup: WarmupSpec | None = None) -> None:
        """``warmup``: how ``model`` was loaded, to compile new shapes in a child process
        (:mod:`rlcore_hf.compile_warmup`) while the caller decodes eagerly (see :meth:`ready`);
        None: compile in this process at the first call of a shape."""
        from rlcore_hf.kv_cache import cache_keyword

        self.model = model
        self.warmup = warmup
        self._warmups: dict[tuple[int, int], WarmupProcess] = {}
        keyword = cache_keyword(type(model))

        def step(
            tokens: torch.Tensor, position: torch.Tensor, mask: torch.Tensor, cache: Any
        ) -> Any:
            # One token per row: the last logits (rows, V).
            out = model(
                input_ids=tokens, attention_mask=mask, position_ids=position, use_cache=True,
                **{keyword: cache},
            )  # fmt: skip
            return out.logits[:, -1]

        self._step = torch.compile(step, dynamic=False)
        self._caches: dict[tuple[int, int], Any] = {}
        self._compiled: set[tuple[int, int]] = set()
        self.compile_seconds = 0.0  # summed over first calls of each shape (compile + 1 step)
        self.warmup_seconds = 0.0  # summed over background compiles, while decoding eagerly
        self._compiled_elsewhere: set[tuple[int, int]] = set()  # warmed up (or failed) shapes
        self.graphs = 0

    def ready(self, rows: int, width: int, new: int, mask_dtype: torch.dtype) -> bool:
        """Whether :meth:`generate` runs now without compiling in this process for long.

        Without a warm-up spec: always. With one, a shape not compiled yet starts its child
        (False until it is done or failed; then True: the compile here reads inductor's cache,
        or, after a failure, compiles as without a warm-up). Never waits."""
        key = (_bucket_rows(rows), _bucket_length(width + new))
        if self.warmup is None or key in self._compiled or key in self._compiled_elsewhere:
            return True
        child = self._warmups.get(key)
        if child is None:
            from rlcore_hf.compile_warmup import WarmupProcess

            dtype_name = str(mask_dtype).removeprefix("torch.")
            self._warmups[key] = WarmupProcess(self.warmup, rows, width, new, dtype_name)
            log.info(
                "rollout.compile_decode: compiling the decoding step for %d rows x %d positions "
                "in a background process; decoding eagerly until it is done", *key,
            )  # fmt: skip
            return False
        state = child.poll()
        if state == "running":
            return False
        if state == "done":
            log.info(
                "rollout.compile_decode: the background compile of %d rows x %d positions took "
                "%.1f s", *key, child.seconds,
            )  # fmt: skip
        self.warmup_seconds += child.seconds
        del self._warmups[key]
        self._compiled_elsewhere.add(key)
        return True

    def compile_shape(self, rows: int, width: int, new: int, mask_dtype: torch.dtype) -> None:
        """Compile (or load) the step for the shape a ``generate`` of ``rows`` prompts of
        ``width`` tokens and ``new`` new tokens uses, on placeholder tokens: one prefill and
        one step (the warm-up child's work)."""
        padded = _bucket_rows(rows)
        cache = self._cache(padded, _bucket_length(width + new))
        ids = torch.zeros(rows, width, dtype=torch.long)
        mask = torch.ones(rows, width, dtype=mask_dtype)
        positions = torch.arange(width).expand(rows, width)
        self._prefill(cache, ids, mask, positions, padded)
        step_mask = torch.ones(padded, cache.layers[0].max_cache_len, dtype=mask_dtype)
        tokens = torch.zeros(padded, 1, dtype=torch.long)
        position = torch.full((padded, 1), width, dtype=torch.long)
        self._run_step(tokens, position, step_mask, cache)

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        sampling: SamplingParams,
        *,
        eos_token_ids: list[int],
        pad_token_id: int,
        sampler: Any,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(responses (b, max_new_tokens), raw logits per step (b, V))`` for left-padded
        ``input_ids``; ``sampler``: None (greedy) or an object with ``draw(ids, scores)``."""
        from rlcore.engine import position_ids_from_mask

        rows, width = input_ids.shape
        new = sampling.max_new_tokens
        padded = _bucket_rows(rows)
        cache = self._cache(padded, _bucket_length(width + new))
        positions = position_ids_from_mask(attention_mask)
        logits = self._prefill(cache, input_ids, attention_mask, positions, padded)
        # Generated positions are attended; causality (the cache's counter) hides the future.
        mask = torch.ones(padded, cache.layers[0].max_cache_len, dtype=attention_mask.dtype)
        mask = mask.to(input_ids.device)
        mask[:rows, :width] = attention_mask
        mask[rows:, :width] = attention_mask[:1]  # padding rows copy row 0 (_prefill)
        position = torch.cat([positions[:, -1:], positions[:1, -1:].expand(padded - rows, 1)])
        eos = torch.tensor(eos_token_ids, dtype=torch.long, device=input_ids.device)
        ended = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
        tokens = torch.full((padded, 1), pad_token_id, dtype=torch.long, device=input_ids.device)
        out = input_ids.new_full((rows, new), pad_token_id)
        all_logits = []
        for t in range(new):
            scores = logits[:rows].float()  # generate's float32 copy of the raw logits
            all_logits.append(scores)
            picked = scores.argmax(-1) if sampler is None else sampler.draw(None, scores)[:, 0]
            picked = picked.masked_fill(ended, pad_token_id)
            out[:, t] = picked
            ended |= torch.isin(picked, eos)
            if t == new - 1 or bool(ended.all()):
                break
            tokens[:rows, 0] = picked
            position += 1
            logits = self._run_step(tokens, position, mask, cache)
        return out, all_logits

    def _cache(self, rows: int, length: int) -> Any:
        from transformers import StaticCache

        cache = self._caches.get((rows, length))
        if cache is None:
            cache = StaticCache(config=self.model.config, max_cache_len=length)
            self._caches[(rows, length)] = cache
        return cache

    def _prefill(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        padded: int,
    ) -> torch.Tensor:
        """Prefill each distinct prompt once (eager) and copy its keys/values to its rows of
        ``cache`` (rows past the real ones copy row 0); the last position's logits (padded, V)."""
        from transformers import DynamicCache

        from rlcore_hf.kv_cache import cache_keyword
        from rlcore_hf.shared_prefill import prompt_groups

        rows, width = input_ids.shape
        groups = prompt_groups(input_ids, attention_mask)
        if groups is None:
            firsts = torch.arange(rows, device=input_ids.device)
            owner = firsts
        else:
            firsts, owner = (t.to(input_ids.device) for t in groups)
        owner = torch.cat([owner, owner.new_zeros(padded - rows)])
        prefill_cache: Any = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=input_ids.index_select(0, firsts),
            attention_mask=attention_mask.index_select(0, firsts),
            position_ids=positions.index_select(0, firsts),
            use_cache=True,
            logits_to_keep=1,
            **{cache_keyword(type(self.model)): prefill_cache},
        )
        for static, prefilled in zip(cache.layers, prefill_cache.layers, strict=True):
            keys = prefilled.keys.index_select(0, owner)
            values = prefilled.values.index_select(0, owner)
            if not static.is_initialized:
                static.lazy_initialization(keys, values)
            static.keys[:, :, :width].copy_(keys)
            static.values[:, :, :width].copy_(values)
            static.keys[:, :, width:].zero_()
            static.values[:, :, width:].zero_()
            static.cumulative_length.fill_(width)
        return out.logits[:, -1].index_select(0, owner)  # type: ignore[no-any-return]

    def _run_step(
        self, tokens: torch.Tensor, position: torch.Tensor, mask: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        key = (tokens.shape[0], mask.shape[1])
        if key in self._compiled:
            return self._step(tokens, position, mask, cache)  # type: ignore[no-any-return]
        # First step of a shape: compiles (reported once per shape).
        import torch._dynamo.config as dynamo_config

        # The limit raised for this call only: other compiled code of the process keeps its own.
        limit = max(dynamo_config.recompile_limit, _MAX_GRAPHS)
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        with dynamo_config.patch(recompile_limit=limit):
            logits = self._step(tokens, position, mask, cache)
        seconds, cpu_seconds = time.perf_counter() - start, _cpu_seconds() - cpu_start
        self._compiled.add(key)
        self.compile_seconds += seconds
        self.graphs += 1
        # Once per shape; CPU time beside wall time: on a shared machine the wall time is
        # mostly other processes' (inductor's on-disk cache makes a later process's faster).
        log.info(
            "rollout.compile_decode: compiled the decoding step for %d rows x %d positions in "
            "%.1f s (%.1f s of CPU; %d shape(s) so far)", *key, seconds, cpu_seconds, self.graphs,
        )  # fmt: skip
        return logits  # type: ignore[no-any-return]


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (inductor's C++ compiler runs)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def attention_for_compiled_decode() -> str:
    """Register :func:`grouped_decode_attention` with transformers; the name to load with."""
    from rlcore_hf.prefix_attention import register_sdpa_attention

    return register_sdpa_attention(DECODE_ATTENTION, grouped_decode_attention)


def grouped_decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A decoding step's attention without copying the cache per query head.

    With a mask, transformers' sdpa expands grouped keys/values to every query head
    (``repeat_kv``): over a static cache that copies the whole cache at every step (measured:
    the largest cost of the compiled step at 64 rows). One query per row needs no kernel:
    each kv head's query heads in one matmul against its keys, a softmax, one matmul with its
    values. Anything else (the prefill, sliding windows, dropout) is transformers' sdpa.
    (B, H, 1, D) query, (B, K, L, D) keys/values -> (B, 1, H, D)."""
    if query.shape[2] != 1 or dropout or sliding_window or kwargs.get("softcap"):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            sliding_window=sliding_window, **kwargs,
        )  # fmt: skip
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # (B, K, g, L)
    if attention_mask is not None:
        mask = attention_mask.reshape(rows, 1, 1, -1)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, K, g, D)
    return out.reshape(rows, 1, heads, dim), None
