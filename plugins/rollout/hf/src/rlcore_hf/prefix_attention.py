"""Decoding against a prompt's keys and values held once per group, not once per sample.

Why: after the shared prefill (rlcore_hf.shared_prefill), a step of decoding reads every row's
whole KV cache, and the n samples of a prompt hold n copies of the prompt's part. On a CPU this
attention is bound by memory reads (128 rows, 50-token prompts: ~5 MB per layer and step), and
it was the largest single cost of ``generate`` on ``benchmarks/vs_trl.py``'s dense row. Here
the prompt's keys/values stay as the prefill left them, one per distinct prompt
(:class:`~rlcore_hf.kv_cache.GrowingKVLayer` with ``share_prefix``), and only the generated
tokens are kept per row.

:func:`prefix_sdpa_attention` is a transformers attention function (registered as
:data:`PREFIX_SDPA`, the mask built as for ``sdpa``). For a decoding step (one query) whose
layer holds a shared prefix, each row's scores are its group's prompt keys (one matmul per group
for all of its rows and heads) and its own generated keys, one softmax over both, and the
output the matching sum over the prompt's and its own values. Anything else (the prefill, a
layer without a shared prefix, sliding windows, dropout) is transformers' own sdpa.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch

__all__ = [
    "PREFIX_SDPA",
    "PrefixNotReadError",
    "attention_for_prefix_sharing",
    "decoding_with",
    "prefix_sdpa_attention",
    "register_sdpa_attention",
    "shared_prefix_decode",
]

PREFIX_SDPA = "rlcore_prefix_sdpa"
# The cache of the generate call in progress (transformers' generate refuses keywords its model
# does not declare, so the cache cannot ride along as one).
_CACHE: ContextVar[Any] = ContextVar("rlcore_prefix_cache", default=None)


class PrefixNotReadError(RuntimeError):
    """A layer held a shared prompt prefix that its attention never read: the model does not
    call attention through transformers' interface, and its outputs would be wrong."""


@contextlib.contextmanager
def decoding_with(cache: Any) -> Iterator[None]:
    """Within the block, attention finds each layer's shared prefix in ``cache``; on leaving,
    every decoding step of a layer that held one must have read it (else
    :class:`PrefixNotReadError`, also in place of the shape error plain sdpa may raise first:
    its tokens attended to the generated part alone)."""
    token = _CACHE.set(cache)
    try:
        yield
    except Exception as err:
        unread = _unread(cache)
        if unread:
            raise PrefixNotReadError(unread) from err
        raise
    finally:
        _CACHE.reset(token)
    unread = _unread(cache)
    if unread:
        raise PrefixNotReadError(unread)


def _unread(cache: Any) -> str:
    """What went unread, or ''."""
    for index, layer in enumerate(getattr(cache, "layers", ())):
        if getattr(layer, "prefix", None) is not None and layer.prefix_reads != layer.prefix_steps:
            return (
                f"layer {index} read its shared prompt keys in {layer.prefix_reads} of "
                f"{layer.prefix_steps} decoding steps: this model's attention does not go "
                "through transformers' attention functions; set rollout.share_prompt_kv = false"
            )
    return ""


def register_sdpa_attention(name: str, function: Any) -> str:
    """Register ``function`` with transformers as attention ``name``, masked as sdpa is (the
    function falls back to sdpa where it does not apply); the name to load a model with."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def attention_for_prefix_sharing() -> str:
    """Register :func:`prefix_sdpa_attention` with transformers; the name to load a model with."""
    return register_sdpa_attention(PREFIX_SDPA, prefix_sdpa_attention)


def prefix_sdpa_attention(
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
    """transformers' attention-function signature: (B, H, q, D) query -> (B, q, H, D)."""
    layer = _layer(_CACHE.get(), getattr(module, "layer_idx", None))
    prefix = getattr(layer, "prefix", None)
    if prefix is None or query.shape[2] != 1 or dropout or sliding_window or kwargs.get("softcap"):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            sliding_window=sliding_window, **kwargs,
        )  # fmt: skip
    out = shared_prefix_decode(query, key, value, prefix, layer.group_size, attention_mask, scaling)
    layer.prefix_reads += 1
    return out, None


def _layer(cache: Any, index: int | None) -> Any:
    layers = getattr(cache, "layers", None)
    if layers is None or index is None or index >= len(layers):
        return None
    return layers[index]


def shared_prefix_decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    prefix: tuple[torch.Tensor, torch.Tensor],
    group_size: int,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """One decoding step: (B, H, 1, D) queries against each row's group prefix and own keys.

    ``prefix``: keys and values (G, K, P, D) of the G distinct prompts, row ``i`` belonging to
    prompt ``i // group_size``; ``key``/``value``: (B, K, T, D), each row's generated tokens;
    ``attention_mask``: transformers' (B, 1, 1, P + T) boolean (True: attend) or additive mask,
    or None. Query head ``h`` reads key/value head ``h // (H // K)`` (grouped-query attention,
    as transformers' ``repeat_kv``). Returns (B, 1, H, D).
    """
    rows, heads, _, dim = query.shape
    prefix_keys, prefix_values = prefix
    groups, kv_heads, prompt, _ = prefix_keys.shape
    per_kv = heads // kv_heads
    scale = scaling if scaling is not None else dim**-0.5

    q = query.reshape(rows, kv_heads, per_kv, dim)
    # All rows and heads of a group against its prompt keys in one matmul per group.
    grouped = q.view(groups, group_size, kv_heads, per_kv, dim).transpose(1, 2)
    grouped = grouped.reshape(groups, kv_heads, group_size * per_kv, dim)
    on_prompt = torch.matmul(grouped, prefix_keys.transpose(-1, -2))  # (G, K, n*g, P)
    on_prompt = on_prompt.view(groups, kv_heads, group_size, per_kv, prompt).transpose(1, 2)
    on_own = torch.matmul(q, key.transpose(-1, -2))  # (B, K, g, T)
    scores = torch.cat([on_prompt.reshape(rows, kv_heads, per_kv, prompt), on_own], dim=-1)
    scores = scores.float() * scale
    if attention_mask is not None:
        mask = attention_mask.reshape(rows, 1, 1, -1)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1).to(query.dtype)

    to_prompt = probs[..., :prompt].reshape(groups, group_size, kv_heads, per_kv, prompt)
    to_prompt = to_prompt.transpose(1, 2).reshape(groups, kv_heads, group_size * per_kv, prompt)
    out = torch.matmul(to_prompt, prefix_values)  # (G, K, n*g, D)
    out = out.view(groups, kv_heads, group_size, per_kv, dim).transpose(1, 2)
    out = out.reshape(rows, kv_heads, per_kv, dim) + torch.matmul(probs[..., prompt:], value)
    return out.reshape(rows, 1, heads, dim)
