"""A tiny Qwen2 causal LM and a character-level tokenizer, built offline for tests and demos.

There is no model hub here, so tests, the quickstart and benchmarks build a model from a
config and ``save_pretrained`` it to a folder that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load like any Hugging Face checkpoint::

    from rlcore.testing.tiny_model import build_tiny_model
    path = build_tiny_model(tmp_path / "tiny")          # ~0.1 M parameters, CPU-friendly
    model = AutoModelForCausalLM.from_pretrained(path)

The tokenizer is byte-level with no merges: every ASCII character is one token and any text
round-trips through ``encode``/``decode`` exactly. It carries a ChatML chat
template (``<|im_start|>role\\n...<|im_end|>\\n``), ``eos_token = "<|im_end|>"`` and
``pad_token = "<|endoftext|>"``, like Qwen2.5-Instruct, so code written against the real model
runs unchanged. The model's ``eos_token_id``/``pad_token_id``/``bos_token_id`` and its
``generation_config`` agree with the tokenizer.

torch and transformers are imported inside the function: importing this module is cheap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "build_tiny_reward_model",
    "char_vocab",
]

# Special tokens first, so their ids are stable: pad 0, im_start 1, im_end 2 (= eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# ChatML, as Qwen2.5 uses it (without the default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map that byte-level BPE vocabularies are written in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def char_vocab() -> dict[str, int]:
    """Token -> id: the three special tokens, then one token per byte (259 tokens).

    Byte-level with no merges: every ASCII character is exactly one token, and any UTF-8
    text round-trips. This is the shape transformers' ``Qwen2Tokenizer`` rebuilds from
    ``tokenizer.json`` (it forces that class for ``model_type = "qwen2"``), so the tokenizer
    behaves identically whichever class loads it.
    """
    table = _bytes_to_unicode()
    tokens = [*SPECIAL_TOKENS, *(table[b] for b in range(256))]
    return {tok: i for i, tok in enumerate(tokens)}


def build_tiny_model(
    path: str | os.PathLike[str],
    *,
    vocab: str = "chars",
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    max_position_embeddings: int = 2048,
    chat_template: str | None = None,
    extra_special_tokens: Sequence[str] = (),
    eos_token: str = "<|im_end|>",
    stop_tokens: Sequence[str] = (),
) -> Path:
    """Build and save a random ``Qwen2ForCausalLM`` plus its tokenizer under ``path``.

    ``hidden / heads`` is the head size and must be >= 32 (smaller heads hit slow/unsupported
    attention paths); the intermediate size is ``2 * hidden``. Weights are float32, drawn with
    ``torch.manual_seed(seed)``, so the same arguments give bit-identical folders. Returns
    ``Path(path)``. ``vocab`` selects the tokenizer; only ``"chars"`` exists today.

    Another model family's chat layout: ``chat_template`` (default: ChatML), its
    ``extra_special_tokens`` (appended to the vocabulary, each one token: ``<|eot_id|>``,
    ``<|observation|>``, ...), ``eos_token`` (one of the special tokens) and ``stop_tokens``
    (more tokens that end a generation, in ``generation_config.eos_token_id``).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    if vocab != "chars":
        msg = f"build_tiny_model: unknown vocab {vocab!r}; only 'chars' is available"
        raise ValueError(msg)
    if hidden % heads or hidden // heads < 32:
        msg = f"build_tiny_model: hidden={hidden} / heads={heads} must be a whole head size >= 32"
        raise ValueError(msg)
    if heads % kv_heads:
        msg = f"build_tiny_model: heads={heads} must be a multiple of kv_heads={kv_heads}"
        raise ValueError(msg)

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    # --- tokenizer: byte-level BPE without merges (one token per ASCII character)
    token_to_id = char_vocab()
    for token in extra_special_tokens:
        token_to_id.setdefault(token, len(token_to_id))
    unknown = [t for t in (eos_token, *stop_tokens) if t not in token_to_id]
    if unknown:
        msg = f"build_tiny_model: {unknown} are not in extra_special_tokens"
        raise ValueError(msg)
    specials = ["<|im_start|>", *(t for t in extra_special_tokens if t != eos_token)]
    if eos_token != "<|im_end|>":
        specials.append("<|im_end|>")
    hf_tok = Qwen2Tokenizer(
        vocab=token_to_id,
        merges=[],
        eos_token=eos_token,
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        additional_special_tokens=specials,
    )
    hf_tok.chat_template = chat_template if chat_template is not None else CHAT_TEMPLATE
    hf_tok.save_pretrained(out)

    # --- model
    pad_id, eos_id = token_to_id["<|endoftext|>"], token_to_id[eos_token]
    stop_ids = [eos_id, *(token_to_id[t] for t in stop_tokens if token_to_id[t] != eos_id)]
    config = Qwen2Config(
        vocab_size=len(token_to_id),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos_id if len(stop_ids) == 1 else stop_ids
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = pad_id
    model.save_pretrained(out, safe_serialization=True)
    return out


def build_tiny_reward_model(
    path: str | os.PathLike[str], *, from_model: str | os.PathLike[str] | None = None, **kwargs: Any
) -> Path:
    """A ``Qwen2ForSequenceClassification`` with one label (a reward model) under ``path``.

    ``from_model``: a causal-LM folder (e.g. :func:`build_tiny_model`'s) whose backbone and
    tokenizer it starts from, the score head fresh; None: a fresh :func:`build_tiny_model`
    with ``kwargs`` (same tokenizer, ``seed`` seeds the head too).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = Path(path)
    source = Path(from_model) if from_model is not None else build_tiny_model(out, **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(kwargs.get("seed", 0)))
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    for stale in out.glob("*.safetensors"):  # the causal LM's weights, when built here
        stale.unlink()
    model.save_pretrained(out, safe_serialization=True)
    if from_model is not None:
        AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out
