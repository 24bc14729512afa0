"""Fixtures of the vLLM rollout tests: one tiny model, one engine per module.

The tests that need vLLM skip where it is not installed (the main .venv), with a line saying
how they run (``bash scripts/test_vllm.sh``); with ``RLCORE_REQUIRE_VLLM=1`` (that script, CI)
a missing vLLM fails them instead, so CI cannot pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRE_VLLM = os.environ.get("RLCORE_REQUIRE_VLLM") == "1"


@pytest.fixture(scope="session")
def need_vllm():
    if not HAVE_VLLM:
        msg = "vLLM is not installed here; bash scripts/test_vllm.sh runs these in .venv-vllm"
        if REQUIRE_VLLM:
            pytest.fail(msg + " (RLCORE_REQUIRE_VLLM=1)")
        pytest.skip(msg)


# 64 short arithmetic prompts (chat-templated by ``make_prompts``).
TEXTS = [f"{w} {i} + {3 * i % 17} = ?" for i, w in zip(range(64), ["What is", "Sum", "Add"] * 22)]


def build_model(path, seed: int = 0, new_tokens: int = 24):
    """The tiny Qwen2 (2 layers, head size 32, float32) with EOS made reachable.

    Random weights almost never pick EOS, which would leave the EOS handling untested. The
    greedy responses to :data:`TEXTS` are probed, and the EOS row of ``lm_head`` becomes 1.05x
    the row of the token that appears in closest to half of them (not as the first token), so
    EOS wins where that token would: about half the responses end early, at varied lengths.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing.tiny_model import build_tiny_model

    out = build_tiny_model(path, hidden=64, layers=2, heads=2, kv_heads=1, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompts = _make_prompts(str(out), TEXTS)
    eos = model.config.eos_token_id
    with torch.no_grad():
        ids = model.generate(
            input_ids=prompts.batch["input_ids"],
            attention_mask=prompts.batch["attention_mask"],
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=model.config.pad_token_id,
        )[:, prompts.batch["input_ids"].shape[1] + 1 :]
        rows_with = torch.zeros(model.config.vocab_size)
        for row in ids:
            rows_with[row.unique()] += 1
        rows_with[[eos, model.config.pad_token_id]] = 0
        token = int((rows_with - len(TEXTS) / 2).abs().argmin())
        model.lm_head.weight[eos] = 1.05 * model.lm_head.weight[token]
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_model(tmp_path_factory.mktemp("vllm") / "tiny"))


@pytest.fixture(scope="session")
def make_prompts():
    return _make_prompts


@pytest.fixture(scope="session")
def texts():
    return list(TEXTS)


@pytest.fixture(scope="session")
def make_model():
    return build_model


def _make_prompts(model_path: str, texts: list[str]):
    """Left-padded chat prompts as the driver hands them to a rollout."""
    from transformers import AutoTokenizer

    from rlcore.protocol import DataProto

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    chats = [
        tok.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in texts
    ]
    enc = tok(chats, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


@pytest.fixture(scope="session")
def vllm_toml():
    return _vllm_run_toml


def _vllm_run_toml(tmp_path: Path, *, total_steps: int, **kw) -> str:
    """The tiny run (``rlcore.testing.runs``) with the vLLM rollout on a 64 MiB KV cache, the
    driver's old-log-prob pass scoring every row (so the mismatch metric covers them all)."""
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl

    model = tiny_run_model(tmp_path / "model")
    rows = arithmetic_rows([(i, i + 1) for i in range(8)])
    train = write_jsonl(rows, tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=model, train_files=[train], run_dir=tmp_path / "run", total_steps=total_steps, **kw
    ).replace('name = "hf"', 'name = "vllm"\nkv_cache_space_gb = 0.0625')
    return text.replace("[actor]\n", "[actor]\nreuse_on_policy_log_probs = false\n", 1)
