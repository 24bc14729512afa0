"""Packed causal attention in one FlexAttention kernel (CUDA), behind a probe.

:func:`rlcore_fsdp2.packing.varlen_sdpa_attention` runs one ``scaled_dot_product_attention``
per row of a packed sequence, from Python, after reading the row bounds to the host once per
layer: correct everywhere, and on CPU (what CI runs) it stays the path. On a CUDA device the
same attention is one ``flex_attention`` call with a block mask "same row and causal"
(:func:`packed_flex_attention`): no per-row launches, no host sync (the row ids come from
``cu_seq_lens`` with ``repeat_interleave(..., output_size=N)``), and the block mask is built once
per forward (every layer gets the same ``cu_seq_lens`` tensor). It is used only after a probe on
that device (:func:`flex_ready`) ran the compiled kernel forward and backward on a small packed
input and matched the per-row path; a failing probe logs one warning and keeps the per-row path.
Shared-prompt packing and attention dropout keep the per-row path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["flex_ready", "packed_flex_attention", "per_row_attention"]

_probed: dict[str, bool] = {}  # device -> the probe's verdict
_mask_cache: list[Any] = []  # [cu_seq_lens tensor, N, block mask]: the last forward's
_compiled: list[Any] = []


def per_row_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """The reference: causal sdpa per row of (1, H, N, D) inputs -> (1, H, N, D)."""
    bounds = torch.diff(cu_seq_lens).tolist()
    outs = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scaling, is_causal=True)
        for q, k, v, n in zip(
            query.split(bounds, 2), key.split(bounds, 2), value.split(bounds, 2), bounds
        )
        if n > 0
    ]
    return torch.cat(outs, dim=2)


def _block_mask(cu_seq_lens: torch.Tensor, n: int, device: torch.device) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    if _mask_cache and _mask_cache[0] is cu_seq_lens and _mask_cache[1] == n:
        return _mask_cache[2]
    cu = cu_seq_lens.to(device=device, dtype=torch.long)
    rows = torch.arange(cu.numel() - 1, device=device)
    row_of = torch.repeat_interleave(rows, torch.diff(cu), output_size=n)

    def same_row_causal(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (row_of[q_idx] == row_of[kv_idx]) & (q_idx >= kv_idx)

    mask = create_block_mask(same_row_causal, None, None, n, n, device=device)
    _mask_cache[:] = [cu_seq_lens, n, mask]
    return mask


def packed_flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    scaling: float | None,
    *,
    compiled: bool = True,
) -> torch.Tensor:
    """Causal attention within each row of (1, H, N, D) inputs, one kernel -> (1, H, N, D).

    ``compiled=False`` runs FlexAttention's eager reference (forward only; what the CPU test
    compares against the per-row path).
    """
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if compiled:
        if not _compiled:
            _compiled.append(torch.compile(flex_attention, dynamic=True))
        fn = _compiled[0]
    mask = _block_mask(cu_seq_lens, query.shape[2], query.device)
    return fn(query, key, value, block_mask=mask, scale=scaling)  # type: ignore[no-any-return]


def flex_ready(device: torch.device) -> bool:
    """Whether :func:`packed_flex_attention` may replace the per-row path on ``device``.

    CPU: never (the per-row path stays, bit for bit). CUDA: once per device, the compiled
    kernel runs forward and backward on a small packed input and must match the per-row path
    (outputs and gradients within 2e-3 in float32); any error or mismatch keeps the per-row path.
    """
    if device.type != "cuda":
        return False
    name = str(device)
    if name not in _probed:
        _probed[name] = _probe(device)
    return _probed[name]


def _probe(device: torch.device) -> bool:
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        bounds = [37, 5, 90, 1, 60]
        n = sum(bounds)
        cu = torch.tensor([0, *torch.tensor(bounds).cumsum(0).tolist()], dtype=torch.int32)
        inputs = [torch.randn(1, 2, n, 64, generator=gen).to(device) for _ in range(3)]
        grads = []
        outs = []
        for flex in (True, False):
            q, k, v = (t.clone().requires_grad_(True) for t in inputs)
            cu_dev = cu.to(device)
            out = (
                packed_flex_attention(q, k, v, cu_dev, None)
                if flex
                else per_row_attention(q, k, v, cu_dev, None)
            )
            out.square().sum().backward()
            outs.append(out.detach())
            grads.append([t.grad for t in (q, k, v)])
        worst = max(
            float((a - b).abs().max())
            for a, b in zip([outs[0], *grads[0]], [outs[1], *grads[1]], strict=True)
        )
        if worst > 2e-3:
            log.warning(
                "FlexAttention on %s differs from per-row attention by %.2e: keeping per-row",
                device,
                worst,
            )
            return False
        log.info("packed attention on %s: one FlexAttention kernel (probe: %.1e)", device, worst)
        return True
    except Exception as err:  # any failure (no triton, old driver, ...) keeps the per-row path
        log.warning("FlexAttention unavailable on %s (%s): keeping per-row attention", device, err)
        return False
    finally:
        _mask_cache.clear()
