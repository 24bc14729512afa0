"""HF <-> megatron weight mapping: layouts and round trips, pure tensors (no process group)."""

from __future__ import annotations

import pytest
import torch

from rlcore_megatron.mapping import (
    MappingError,
    ModelDims,
    hf_names,
    megatron_names,
    merge_to_hf,
    shard_from_hf,
)


def qwen2_config(**kw):
    from transformers import Qwen2Config

    base = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        num_hidden_layers=2,
        vocab_size=259,
        tie_word_embeddings=False,
    )
    return Qwen2Config(**{**base, **kw})


def random_hf_state(dims: ModelDims, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random HF state dict with exactly the names and shapes of the model ``dims`` describes."""
    g = torch.Generator().manual_seed(seed)
    h, hd = dims.hidden, dims.head_dim
    shapes = {"model.embed_tokens.weight": (dims.vocab, h), "model.norm.weight": (h,)}
    for i in range(dims.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (dims.heads * hd, h),
            p + "self_attn.k_proj.weight": (dims.kv_heads * hd, h),
            p + "self_attn.v_proj.weight": (dims.kv_heads * hd, h),
            p + "self_attn.o_proj.weight": (h, dims.heads * hd),
            p + "mlp.gate_proj.weight": (dims.ffn, h),
            p + "mlp.up_proj.weight": (dims.ffn, h),
            p + "mlp.down_proj.weight": (h, dims.ffn),
        }
        if dims.qkv_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (dims.heads * hd,),
                p + "self_attn.k_proj.bias": (dims.kv_heads * hd,),
                p + "self_attn.v_proj.bias": (dims.kv_heads * hd,),
            }
    if dims.value_head:
        shapes |= {"score.weight": (1, h), "score.bias": (1,)}
    elif not dims.tie_embeddings:
        shapes["lm_head.weight"] = (dims.vocab, h)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def round_trip(hf: dict[str, torch.Tensor], dims: ModelDims, tp: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name in megatron_names(dims):
        shards = [shard_from_hf(name, hf, dims, tp=tp, tp_rank=r) for r in range(tp)]
        for hf_name, tensor in merge_to_hf(name, shards, dims):
            assert hf_name not in out, f"{hf_name} produced twice"
            out[hf_name] = tensor
    return out


@pytest.mark.parametrize(
    ("tp", "overrides"),
    [
        (1, {}),
        (2, {}),
        (2, {"tie_word_embeddings": True}),
        (4, {"num_key_value_heads": 4}),  # MHA, 4 ranks
        (2, {"num_key_value_heads": 2, "num_attention_heads": 8, "hidden_size": 64}),  # GQA 4:1
    ],
)
def test_round_trip_is_exact(tp, overrides):
    dims = ModelDims.from_hf_config(qwen2_config(**overrides), tp=tp)
    hf = random_hf_state(dims)
    back = round_trip(hf, dims, tp)
    if dims.tie_embeddings:
        assert torch.equal(back.pop("lm_head.weight"), hf["model.embed_tokens.weight"])
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_llama_has_no_qkv_bias_and_value_head_round_trips():
    from transformers import LlamaConfig

    llama = LlamaConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        num_hidden_layers=1,
        vocab_size=100,
    )
    dims = ModelDims.from_hf_config(llama, tp=2)
    assert not dims.qkv_bias
    assert not any(n.endswith("linear_qkv.bias") for n in megatron_names(dims))
    critic = ModelDims.from_hf_config(qwen2_config(tie_word_embeddings=True), tp=2, value_head=True)
    assert not critic.tie_embeddings  # a critic has no LM head to tie
    hf = random_hf_state(critic)
    assert round_trip(hf, critic, 2).keys() == hf.keys()
    assert hf_names("output_layer.bias", critic) == ("score.bias",)


def test_qkv_is_fused_per_query_group_and_split_by_groups():
    dims = ModelDims.from_hf_config(qwen2_config(), tp=2)  # 4 q heads, 2 groups, head_dim 8
    hf = random_hf_state(dims)
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    hd = dims.head_dim
    rank1 = shard_from_hf(
        "decoder.layers.0.self_attention.linear_qkv.weight", hf, dims, tp=2, tp_rank=1
    )
    # rank 1 holds group 1 only: query heads 2 and 3, then key head 1, then value head 1
    expected = torch.cat([q[2 * hd : 4 * hd], k[hd : 2 * hd], v[hd : 2 * hd]])
    assert torch.equal(rank1, expected)


def test_fc1_shard_is_gate_then_up_of_that_rank():
    dims = ModelDims.from_hf_config(qwen2_config(), tp=2)
    hf = random_hf_state(dims)
    gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    shard = shard_from_hf("decoder.layers.1.mlp.linear_fc1.weight", hf, dims, tp=2, tp_rank=0)
    assert torch.equal(shard, torch.cat([gate[:24], up[:24]]))
    proj = shard_from_hf(
        "decoder.layers.1.self_attention.linear_proj.weight", hf, dims, tp=2, tp_rank=1
    )
    assert torch.equal(proj, hf["model.layers.1.self_attn.o_proj.weight"][:, 16:])


def test_vocab_is_padded_with_zero_rows_to_a_multiple_of_tp():
    dims = ModelDims.from_hf_config(qwen2_config(), tp=2)
    assert (dims.vocab, dims.padded_vocab) == (259, 260)
    hf = random_hf_state(dims)
    last = shard_from_hf("embedding.word_embeddings.weight", hf, dims, tp=2, tp_rank=1)
    assert last.shape == (130, 32)
    assert torch.equal(last[-1], torch.zeros(32))
    assert torch.equal(last[:-1], hf["model.embed_tokens.weight"][130:])


def test_unsupported_models_and_layouts_name_the_problem():
    from transformers import GPT2Config

    with pytest.raises(MappingError, match="model_type='gpt2'"):
        ModelDims.from_hf_config(GPT2Config())
    with pytest.raises(MappingError, match="tensor_parallel=4 must divide"):
        ModelDims.from_hf_config(qwen2_config(), tp=4)  # 2 kv heads
    with pytest.raises(MappingError, match="no HF counterpart"):
        hf_names("decoder.layers.0.mlp.router.weight", ModelDims.from_hf_config(qwen2_config()))
