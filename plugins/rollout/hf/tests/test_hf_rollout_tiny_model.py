"""rlcore.testing.tiny_model: the offline model + tokenizer every CPU test and demo builds."""

from __future__ import annotations

import pytest

from rlcore.testing.tiny_model import SPECIAL_TOKENS, build_tiny_model


def test_tiny_model_folder_loads_and_round_trips_text(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path / "a", hidden=64, heads=2, kv_heads=1, seed=5)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    text = "Natalia sold 48/2 = 24 clips.\n#### 72\ttab é"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(tok("abc 12")["input_ids"]) == 6  # one token per ASCII character
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert [tok.convert_ids_to_tokens(i) for i in range(3)] == list(SPECIAL_TOKENS)
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    assert model.config.eos_token_id == tok.eos_token_id == model.generation_config.eos_token_id
    assert model.config.vocab_size == len(tok) == 259
    assert model.config.hidden_size // model.config.num_attention_heads == 32


def test_tiny_model_is_deterministic_per_seed(tmp_path):
    a = build_tiny_model(tmp_path / "a", hidden=64, heads=2, kv_heads=1, seed=1)
    b = build_tiny_model(tmp_path / "b", hidden=64, heads=2, kv_heads=1, seed=1)
    c = build_tiny_model(tmp_path / "c", hidden=64, heads=2, kv_heads=1, seed=2)
    weights = [(p / "model.safetensors").read_bytes() for p in (a, b, c)]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]


def test_tiny_model_rejects_small_heads(tmp_path):
    with pytest.raises(ValueError, match="head size >= 32"):
        build_tiny_model(tmp_path / "x", hidden=64, heads=4)
