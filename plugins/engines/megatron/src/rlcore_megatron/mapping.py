"""Hugging Face <-> megatron-core weights for Qwen2 / Llama-style decoders, with TP shards.

Pure tensor functions (no process group), so both directions are unit tested directly. The
layouts megatron-core's ``GPTModel`` (local or Transformer Engine layer spec) uses:

- ``self_attention.linear_qkv``: q, k and v fused *per query group*. For each of the
  ``G`` key/value heads: its ``nq / G`` query heads, then its key head, then its value head,
  each ``head_dim`` rows. A tensor-parallel rank holds ``G / tp`` whole groups, so the fused
  tensor splits with a plain ``chunk(tp)`` along rows (GQA needs ``G % tp == 0``).
- ``mlp.linear_fc1``: ``gate_proj`` and ``up_proj`` stacked, but *per rank*: rank r holds
  ``[gate rows of r; up rows of r]``, so merging needs every shard split in half.
- Column-parallel weights (qkv, fc1, embedding, output layer) split along dim 0, row-parallel
  ones (``linear_proj``, ``linear_fc2``) along dim 1; norms are replicated.
- The vocabulary is padded to a multiple of ``tp`` (``padded_vocab``): the pad rows are zero
  and dropped again on the way back.
- Tied embeddings (``tie_word_embeddings``): megatron keeps one ``embedding.word_embeddings``
  (plus, with pipeline parallelism, a synchronised copy in the last stage's
  ``output_layer``); HF gets it under both ``model.embed_tokens.weight`` and
  ``lm_head.weight``.
- The critic's value head is ``output_layer`` (``weight`` (1, H) and ``bias``), HF's
  ``score`` of ``*ForTokenClassification``.

Megatron names here use *global* layer numbers (``decoder.layers.{i}``); the model builder
converts to a pipeline stage's local numbering.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import torch

__all__ = [
    "MappingError",
    "ModelDims",
    "hf_names",
    "megatron_names",
    "merge_to_hf",
    "shard_from_hf",
]


class MappingError(ValueError):
    """A model the mapping cannot represent (or a layout that does not divide)."""


@attrs.frozen(kw_only=True)
class ModelDims:
    """The shapes the mapping needs, read from an HF config (:meth:`from_hf_config`)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    vocab: int
    padded_vocab: int
    tie_embeddings: bool
    qkv_bias: bool
    value_head: bool = False

    @classmethod
    def from_hf_config(cls, config: Any, *, tp: int = 1, value_head: bool = False) -> ModelDims:
        model_type = getattr(config, "model_type", "?")
        if model_type not in ("qwen2", "llama", "mistral"):
            msg = (
                f"the megatron engine maps Qwen2/Llama-style models; model_type={model_type!r} "
                "is not supported"
            )
            raise MappingError(msg)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        vocab = int(config.vocab_size)
        if kv_heads % tp or heads % tp:
            msg = (
                f"tensor_parallel={tp} must divide num_attention_heads={heads} and "
                f"num_key_value_heads={kv_heads}"
            )
            raise MappingError(msg)
        if int(config.intermediate_size) % tp:
            msg = f"tensor_parallel={tp} must divide intermediate_size={config.intermediate_size}"
            raise MappingError(msg)
        qkv_bias = model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        return cls(
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            ffn=int(config.intermediate_size),
            layers=int(config.num_hidden_layers),
            vocab=vocab,
            padded_vocab=-(-vocab // tp) * tp,
            # A critic has no LM head: nothing to tie.
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)) and not value_head,
            qkv_bias=qkv_bias,
            value_head=value_head,
        )

    @property
    def q_per_group(self) -> int:
        return self.heads // self.kv_heads


# --- names ----------------------------------------------------------------------------------

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# megatron per-layer suffix -> HF per-layer suffixes it is made of
_LAYER_PARTS: dict[str, tuple[str, ...]] = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "self_attention.linear_qkv.weight": (
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
    ),
    "self_attention.linear_qkv.bias": (
        "self_attn.q_proj.bias",
        "self_attn.k_proj.bias",
        "self_attn.v_proj.bias",
    ),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight",),
}


def megatron_names(dims: ModelDims) -> list[str]:
    """Every megatron parameter of the whole model (global layer numbers), in model order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(dims.layers):
        for suffix in _LAYER_PARTS:
            if suffix.endswith(".bias") and not dims.qkv_bias:
                continue
            names.append(f"decoder.layers.{i}.{suffix}")
    names.append("decoder.final_layernorm.weight")
    if dims.value_head:
        names += ["output_layer.weight", "output_layer.bias"]
    elif not dims.tie_embeddings:
        names.append("output_layer.weight")
    return names


def hf_names(name: str, dims: ModelDims) -> tuple[str, ...]:
    """The HF parameter names one megatron parameter (global numbering) becomes."""
    if name == "embedding.word_embeddings.weight":
        return (
            ("model.embed_tokens.weight", "lm_head.weight")
            if dims.tie_embeddings
            else ("model.embed_tokens.weight",)
        )
    if name == "decoder.final_layernorm.weight":
        return ("model.norm.weight",)
    if name.startswith("output_layer."):
        if dims.value_head:
            return (f"score.{name.removeprefix('output_layer.')}",)
        return ("lm_head.weight",)
    match = _LAYER.match(name)
    if match is None or match.group(2) not in _LAYER_PARTS:
        msg = f"no HF counterpart for megatron parameter {name!r}"
        raise MappingError(msg)
    layer, suffix = match.groups()
    return tuple(f"model.layers.{layer}.{part}" for part in _LAYER_PARTS[suffix])


# --- HF -> one tensor-parallel shard --------------------------------------------------------


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: ModelDims) -> torch.Tensor:
    """(nq*hd, ...), (G*hd, ...), (G*hd, ...) -> (G*(nq/G+2)*hd, ...), grouped per kv head."""
    g, hd, rest = dims.kv_heads, dims.head_dim, q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(g, dims.q_per_group * hd, *rest),
            k.reshape(g, hd, *rest),
            v.reshape(g, hd, *rest),
        ],
        dim=1,
    )
    return fused.reshape(-1, *rest)


def _pad_vocab(weight: torch.Tensor, dims: ModelDims) -> torch.Tensor:
    if dims.padded_vocab == weight.shape[0]:
        return weight
    pad = weight.new_zeros(dims.padded_vocab - weight.shape[0], *weight.shape[1:])
    return torch.cat([weight, pad])


def shard_from_hf(
    name: str,
    hf: Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor],
    dims: ModelDims,
    *,
    tp: int = 1,
    tp_rank: int = 0,
) -> torch.Tensor:
    """Tensor-parallel rank ``tp_rank``'s shard of megatron parameter ``name`` (global numbering).

    ``hf`` maps HF names to full tensors (a state dict, or a function such as a safetensors
    reader's ``get_tensor``).
    """
    get = hf.__getitem__ if isinstance(hf, Mapping) else hf
    if name == "embedding.word_embeddings.weight":
        return _pad_vocab(get("model.embed_tokens.weight"), dims).chunk(tp)[tp_rank].clone()
    if name == "output_layer.weight" and not dims.value_head:
        source = "model.embed_tokens.weight" if dims.tie_embeddings else "lm_head.weight"
        return _pad_vocab(get(source), dims).chunk(tp)[tp_rank].clone()
    if name.startswith("output_layer."):  # the critic's value head: replicated
        return get(hf_names(name, dims)[0]).clone()
    tensors = [get(n) for n in hf_names(name, dims)]
    suffix = name.split(".", 3)[-1] if name.startswith("decoder.layers.") else name
    if suffix.startswith("self_attention.linear_qkv."):
        q, k, v = tensors
        return _fuse_qkv(q, k, v, dims).chunk(tp)[tp_rank].clone()
    if suffix == "mlp.linear_fc1.weight":
        gate, up = tensors
        return torch.cat([gate.chunk(tp)[tp_rank], up.chunk(tp)[tp_rank]]).clone()
    if suffix in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
        return tensors[0].chunk(tp, dim=1)[tp_rank].clone()
    return tensors[0].clone()  # norms: replicated


# --- tensor-parallel shards -> HF -----------------------------------------------------------


def merge_to_hf(
    name: str, shards: list[torch.Tensor], dims: ModelDims
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) pairs of megatron parameter ``name`` from its ``tp`` shards.

    ``shards`` is ordered by tensor-parallel rank; a replicated parameter may pass one.
    """
    names = hf_names(name, dims)
    suffix = name.split(".", 3)[-1] if name.startswith("decoder.layers.") else name
    if name == "embedding.word_embeddings.weight" or (
        name == "output_layer.weight" and not dims.value_head
    ):
        full = torch.cat(shards)[: dims.vocab]
        for hf_name in names:
            yield hf_name, full
        return
    if suffix.startswith("self_attention.linear_qkv."):
        fused = torch.cat(shards)
        g, hd, rest = dims.kv_heads, dims.head_dim, fused.shape[1:]
        grouped = fused.reshape(g, (dims.q_per_group + 2) * hd, *rest)
        q, k, v = grouped.split([dims.q_per_group * hd, hd, hd], dim=1)
        for hf_name, part in zip(names, (q, k, v)):
            yield hf_name, part.reshape(-1, *rest)
        return
    if suffix == "mlp.linear_fc1.weight":
        halves = [shard.chunk(2) for shard in shards]
        yield names[0], torch.cat([gate for gate, _ in halves])
        yield names[1], torch.cat([up for _, up in halves])
        return
    if suffix in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
        yield names[0], torch.cat(shards, dim=1)
        return
    yield names[0], shards[0]
