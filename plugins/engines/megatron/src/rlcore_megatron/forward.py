"""What makes megatron's forward equal transformers' on rlcore's padded rows.

rlcore rows are left-padded prompts plus right-padded responses with explicit
``position_ids``. transformers rotates queries and keys by those ids and masks pad keys;
megatron's ``GPTModel`` rotates by ``0..S-1`` and masks causally only. Two small pieces close
the gap, both exact:

- :func:`use_position_ids`: the model's rotary embedding reads per-row position ids (set
  with :func:`set_position_ids` before each forward) and returns ``(S, B, 1, D)``
  frequencies, the shape megatron's multimodal RoPE already feeds to ``apply_rotary_pos_emb``.
- :func:`freeze_padding_embedding`: transformers' ``nn.Embedding(padding_idx=pad_token_id)``
  never trains the pad token's row; the same lookups contribute no gradient here.
- :func:`attention_mask`: the boolean ``(B, 1, S, S)`` mask (True = masked) of causal plus
  padded keys, which megatron's attention takes as is.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "attention_mask",
    "freeze_padding_embedding",
    "response_slice",
    "set_position_ids",
    "use_position_ids",
]


def _rope_by_position_ids(self: Any, max_seq_len: int, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``RotaryEmbedding.forward`` replacement: frequencies at ``self.rlcore_position_ids``."""
    positions: torch.Tensor | None = getattr(self, "rlcore_position_ids", None)
    if positions is None:
        positions = torch.arange(max_seq_len, device=self.inv_freq.device)[None]
    inv_freq = self.inv_freq.to(positions.device)
    freqs = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (B, S, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # non-interleaved halves, as HF's rotate_half
    return emb.transpose(0, 1)[:, :, None, :]  # (S, B, 1, D)


class _PositionRotary:
    """Marker mixin: a RotaryEmbedding whose forward reads per-row position ids."""

    forward = _rope_by_position_ids


def use_position_ids(model: torch.nn.Module) -> None:
    """Make ``model.rotary_pos_emb`` rotate by per-row position ids (in place, exact)."""
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is None:
        msg = "the GPTModel has no rotary_pos_emb (position_embedding_type must be 'rope')"
        raise TypeError(msg)
    if getattr(rope, "rotary_interleaved", False):
        msg = "interleaved RoPE has no HF Qwen2/Llama counterpart"
        raise TypeError(msg)
    if not isinstance(rope, _PositionRotary):
        # A subclass created on the fly keeps every attribute and megatron's other methods
        # (get_rotary_seq_len); only forward changes, and without megatron's lru_cache.
        rope.__class__ = type(
            f"PositionIds{type(rope).__name__}", (_PositionRotary, type(rope)), {}
        )


def set_position_ids(model: torch.nn.Module, position_ids: torch.Tensor | None) -> None:
    """Position ids (B, S) the next forward of ``model`` rotates by (None: 0..S-1)."""
    model.rotary_pos_emb.rlcore_position_ids = position_ids  # type: ignore[union-attr]


def attention_mask(valid: torch.Tensor) -> torch.Tensor:
    """(B, S) 0/1 valid tokens -> (B, 1, S, S) bool, True where a query may not attend."""
    s = valid.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=valid.device).triu(1)
    return causal[None, None] | ~valid.bool()[:, None, None, :]


def response_slice(tensor: torch.Tensor, response_length: int) -> torch.Tensor:
    """Positions ``P-1 .. P+R-2`` of (b, P+R, ...): the predictions of the R response tokens."""
    return tensor[:, -(response_length + 1) : -1]


def freeze_padding_embedding(model: torch.nn.Module, pad_token_id: int | None) -> None:
    """Lookups of ``pad_token_id`` pass no gradient to the embedding (HF's ``padding_idx``).

    Only the lookup's contribution is dropped (a tied output layer still trains that row, as
    in transformers), by a forward hook that detaches the looked-up rows of pad tokens.
    """
    embedding = getattr(getattr(model, "embedding", None), "word_embeddings", None)
    if embedding is None or pad_token_id is None:
        return  # not the first pipeline stage, or no padding_idx in the HF model

    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> Any:
        pad = (inputs[0] == pad_token_id).unsqueeze(-1)  # (b, s, 1)
        return torch.where(pad, out.detach(), out) if bool(pad.any()) else out

    embedding.register_forward_hook(hook)
