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

Shared prompts (``share_prompts``): rows next to each other with the same prompt (GRPO's
``n`` samples of one prompt) pack that prompt once, followed by each row's response:
``[prompt, response_1, ..., response_n]``. Each response attends to the shared prompt and
causally to itself (:func:`varlen_sdpa_attention` reads the layout from
:data:`PROMPT_GROUPS_KWARG`; :mod:`rlcore_fsdp2.shared_attention` runs it batched); the
prompt's hidden states are computed once and their gradient is the sum over the rows that
read them, as it is when each row carries a copy. The prompt's tokens run once instead of
``n`` times: on the quickstart (prompts ~35 tokens, responses ~18) that is most of them.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from rlcore.engine import prompt_group_starts
from rlcore_fsdp2.flex import flex_ready, packed_flex_attention
from rlcore_fsdp2.shared_attention import PromptGroups, shared_prompt_attention

# The transformers attention implementation name under which varlen_sdpa_attention runs.
VARLEN_SDPA = "rlcore_varlen_sdpa"
# Implementations that read cu_seq_lens themselves (transformers' flash-attention path).
_NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
# The model-forward keyword that carries a shared-prompt layout down to the attention
# function (transformers passes unknown attention kwargs through, checkpoint recompute too).
PROMPT_GROUPS_KWARG = "rlcore_prompt_groups"


@attrs.frozen(kw_only=True)
class PackedBatch:
    """One micro-batch packed into a (1, N) sequence and the map back to (b, R)."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    # int32 segment bounds: segment i is tokens [cu[i], cu[i+1]); a segment is a row, or,
    # with prompt_groups, a shared prompt or one row's response.
    cu_seq_lens: torch.Tensor
    max_length: int  # the longest segment
    logit_index: torch.Tensor  # (M,) packed positions whose output predicts a response token
    response_index: torch.Tensor  # (M,) the predicted token's flat index in (b * R)
    labels: torch.Tensor  # (M,) the predicted response tokens
    rows: int
    response_length: int
    # Set when rows share their prompt tokens (module docstring); None: one segment per row.
    prompt_groups: PromptGroups | None = None

    def model_kwargs(self) -> dict[str, Any]:
        """Inputs for the HF model's ``forward`` (no attention mask: rows are delimited)."""
        if self.prompt_groups is not None:
            return {
                "input_ids": self.input_ids,
                "position_ids": self.position_ids,
                "attention_mask": None,
                PROMPT_GROUPS_KWARG: self.prompt_groups,
            }
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
    *,
    share_prompts: bool = False,
) -> PackedBatch:
    """Pack a (b, P+R) micro-batch whose last R columns are ``responses`` (b, R).

    Response token j of row i is scored when it and the token before it are valid; its
    prediction is the packed output of that previous token (what ``P-1+j`` is padded).
    ``share_prompts``: adjacent rows with the same prompt pack it once (module docstring).
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
    if not bool(valid.any()):
        msg = "micro-batch has no valid token (attention_mask is all zero)"
        raise ValueError(msg)
    scored = valid[:, p:] & valid[:, p - 1 : t - 1]  # (b, R)
    response_index = torch.arange(b * r, device=input_ids.device).view(b, r)[scored]
    starts = torch.ones(b, dtype=torch.bool, device=input_ids.device)  # a segment per row
    if share_prompts:
        starts = prompt_group_starts(input_ids, attention_mask, r, position_ids)
    # A prompt's tokens are kept on the row that starts its group only.
    keep = valid.clone()
    keep[:, :p] &= starts.unsqueeze(1)
    flat_keep = keep.reshape(-1)
    # Packed position of every kept (row, column); garbage elsewhere (never read).
    packed_at = (flat_keep.long().cumsum(0) - 1).view(b, t)
    predictor = packed_at[:, p - 1 : t - 1].clone()  # (b, R)
    start_rows = starts.nonzero().squeeze(1)  # (G,)
    group_of = starts.long().cumsum(0) - 1  # (b,)
    # Response token 0 is predicted by the last prompt token: the group's shared copy.
    predictor[:, 0] = packed_at[start_rows[group_of], p - 1]
    prompt_lengths = valid[:, :p].sum(dim=1)
    response_lengths = valid[:, p:].sum(dim=1)
    groups: PromptGroups | None = None
    if len(start_rows) < b:
        per_group: list[list[int]] = [[] for _ in range(len(start_rows))]
        for group, length in zip(group_of.tolist(), response_lengths.tolist(), strict=True):
            per_group[group].append(length)
        prompt_of_group = prompt_lengths[start_rows].tolist()
        groups = tuple(
            (lp, tuple(rows)) for lp, rows in zip(prompt_of_group, per_group, strict=True)
        )
        segments = torch.tensor(
            [n for lp, rows in groups for n in (lp, *rows)], device=input_ids.device
        )
    else:
        segments = prompt_lengths + response_lengths
    cu = torch.zeros(len(segments) + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = segments.cumsum(0)
    return PackedBatch(
        input_ids=input_ids.reshape(-1)[flat_keep].unsqueeze(0),
        position_ids=position_ids.reshape(-1)[flat_keep].unsqueeze(0),
        cu_seq_lens=cu,
        max_length=int(segments.max()),
        logit_index=predictor[scored],
        response_index=response_index,
        labels=responses[scored],
        rows=b,
        response_length=r,
        prompt_groups=groups,
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
    rlcore_prompt_groups: PromptGroups | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each row of a packed (1, H, N, D) sequence -> (1, N, H, D).

    With ``rlcore_prompt_groups`` (:data:`PROMPT_GROUPS_KWARG`) rows share prompts: each
    response attends to its group's prompt and causally to itself.

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
    if rlcore_prompt_groups is not None:
        return shared_prompt_attention(query, key, value, rlcore_prompt_groups, dropout, scaling)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: one K/V head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if (
        cu_seq_lens_q is not None
        and query.shape[0] == 1
        and dropout == 0.0
        and query.is_cuda
        and flex_ready(query.device)
    ):  # one kernel on a GPU that passed the probe (rlcore_fsdp2.flex); CPU: per row below
        out = packed_flex_attention(query, key, value, cu_seq_lens_q, scaling)
        return out.transpose(1, 2).contiguous(), None
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
