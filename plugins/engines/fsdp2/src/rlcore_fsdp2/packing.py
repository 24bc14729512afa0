"""Padding-free micro-batches (verl's ``use_remove_padding``): pack rows into one sequence.

A micro-batch arrives as (b, P+R): left-padded prompts, right-padded responses. Packed, its
valid tokens (``attention_mask == 1``) form one (1, N) sequence, rows one after another, each
keeping its own ``position_ids`` (so rotary embeddings see what they see padded). Attention
must not cross rows: the engine passes the row boundaries as ``cu_seq_lens_q/k`` and
``max_length_q/k`` (transformers' names for varlen attention, which its flash-attention path
reads); for ``sdpa``/``eager`` the model runs :func:`varlen_sdpa_attention`, registered with
transformers as :data:`VARLEN_SDPA`, a causal ``scaled_dot_product_attention`` per row. No
(N, N) block-diagonal mask is built: attention costs sum(L_i^2), as padded rows would at best.

Only the positions that predict a response token go through the head (``logits_to_keep`` as
an index tensor), and :meth:`PackedBatch.unpack` scatters those per-token results back to the
(b, R) response layout, 0 where nothing was predicted (padding; the losses mask it anyway).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

# The transformers attention implementation name under which varlen_sdpa_attention runs.
VARLEN_SDPA = "rlcore_varlen_sdpa"
# Implementations that read cu_seq_lens themselves (transformers' flash-attention path).
_NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


@attrs.frozen(kw_only=True)
class PackedBatch:
    """One micro-batch packed into a (1, N) sequence and the map back to (b, R)."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    cu_seq_lens: torch.Tensor  # (b+1,) int32: row i is tokens [cu[i], cu[i+1])
    max_length: int  # the longest row
    logit_index: torch.Tensor  # (M,) packed positions whose output predicts a response token
    response_index: torch.Tensor  # (M,) the predicted token's flat index in (b * R)
    labels: torch.Tensor  # (M,) the predicted response tokens
    rows: int
    response_length: int

    def model_kwargs(self) -> dict[str, Any]:
        """Inputs for the HF model's ``forward`` (no attention mask: rows are delimited)."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": None,
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(M,) per-predicted-token values -> (b, R), 0 elsewhere; differentiable."""
        flat = values.new_zeros(self.rows * self.response_length)
        return flat.index_copy(0, self.response_index, values).view(self.rows, self.response_length)


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
) -> PackedBatch:
    """Pack a (b, P+R) micro-batch whose last R columns are ``responses`` (b, R).

    Response token j of row i is scored when it and the token before it are valid; its
    prediction is the packed output of that previous token (what ``P-1+j`` is padded).
    """
    if position_ids.dim() != 2:
        msg = (
            f"use_remove_padding needs (batch, seq) position_ids, got shape "
            f"{tuple(position_ids.shape)} (multi-axis rotary positions); set "
            "use_remove_padding = false"
        )
        raise ValueError(msg)
    b, t = input_ids.shape
    r = responses.shape[1]
    p = t - r
    if p < 1:
        msg = f"a row needs at least one prompt column before its {r} response columns"
        raise ValueError(msg)
    valid = attention_mask.bool()
    flat_valid = valid.reshape(-1)
    lengths = valid.sum(dim=1)
    if int(lengths.sum()) == 0:
        msg = "micro-batch has no valid token (attention_mask is all zero)"
        raise ValueError(msg)
    cu = torch.zeros(b + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = lengths.cumsum(0)
    # Packed position of every valid (row, column); garbage where invalid (never read).
    packed_at = (flat_valid.long().cumsum(0) - 1).view(b, t)
    scored = valid[:, p:] & valid[:, p - 1 : t - 1]  # (b, R)
    response_index = torch.arange(b * r, device=input_ids.device).view(b, r)[scored]
    return PackedBatch(
        input_ids=input_ids.reshape(-1)[flat_valid].unsqueeze(0),
        position_ids=position_ids.reshape(-1)[flat_valid].unsqueeze(0),
        cu_seq_lens=cu,
        max_length=int(lengths.max()),
        logit_index=packed_at[:, p - 1 : t - 1][scored],
        response_index=response_index,
        labels=responses[scored],
        rows=b,
        response_length=r,
    )


def attention_for_packing(attn_implementation: str) -> str:
    """The implementation to load the model with when packing (registers ours if needed).

    ``sdpa`` and ``eager`` become :data:`VARLEN_SDPA`; flash attention keeps its own varlen
    kernels. Anything else is refused with the key to change.
    """
    if attn_implementation in _NATIVE_VARLEN:
        return attn_implementation
    if attn_implementation not in ("sdpa", "eager", VARLEN_SDPA):
        msg = (
            f"use_remove_padding = true works with attn_implementation 'sdpa', 'eager' or "
            f"{', '.join(repr(n) for n in _NATIVE_VARLEN)}; got {attn_implementation!r} "
            "(set use_remove_padding = false or change attn_implementation)"
        )
        raise ValueError(msg)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
    AttentionMaskInterface.register(VARLEN_SDPA, _padding_mask_only)
    return VARLEN_SDPA


def _padding_mask_only(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """sdpa's mask for a padded call (the model used directly); none for a packed one.

    A packed call has no 2-D mask: rows are delimited by ``cu_seq_lens``, so the (N, N)
    block-diagonal mask transformers would derive from the positions is never built.
    """
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(attention_mask=attention_mask, **kwargs)


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each row of a packed (1, H, N, D) sequence -> (1, N, H, D).

    The transformers attention-function signature. A padded call (a 4-D mask from
    :func:`_padding_mask_only`: the model used outside the engine) is plain sdpa; without
    ``cu_seq_lens_q`` or a mask the input is unpadded (plain causal attention).
    """
    if attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            sliding_window=sliding_window,
            **kwargs,
        )
    if sliding_window is not None:
        msg = (
            "use_remove_padding with sdpa does not implement sliding-window attention; set "
            "use_remove_padding = false (or attn_implementation = 'flash_attention_2')"
        )
        raise NotImplementedError(msg)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: one K/V head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if cu_seq_lens_q is None or query.shape[0] != 1:
        bounds = [query.shape[2]]
        parts_q, parts_k, parts_v = [query], [key], [value]
    else:
        bounds = torch.diff(cu_seq_lens_q).tolist()
        parts_q = list(torch.split(query, bounds, dim=2))
        parts_k = list(torch.split(key, bounds, dim=2))
        parts_v = list(torch.split(value, bounds, dim=2))
    outs = [
        torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, scale=scaling, is_causal=True
        )
        for q, k, v, n in zip(parts_q, parts_k, parts_v, bounds, strict=True)
        if n > 0
    ]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous(), None
