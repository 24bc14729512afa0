"""What the rollout reads from the model folder before vLLM starts: config, head size, special ids.

Checked first so that a model vLLM's CPU build cannot serve fails with one line naming the
fix, instead of an engine traceback 20 s later.
"""

from __future__ import annotations

import logging
from typing import Any

from rlcore.engine.tokenizer import special_ids as core_special_ids
from rlcore.errors import ConfigError
from rlcore.interfaces import RolloutSpec

__all__ = ["CPU_HEAD_SIZES", "check_cpu_head_size", "model_config", "special_ids"]

log = logging.getLogger(__name__)

# Head sizes the CPU attention backend accepts (vllm/v1/attention/backends/cpu_attn.py).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def model_config(spec: RolloutSpec) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(spec.model_path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as err:
        msg = f"[rollout] cannot load a model config from model_path={spec.model_path!r}: {err}"
        raise ConfigError(msg) from err


def check_cpu_head_size(spec: RolloutSpec, config: Any) -> None:
    text = getattr(config, "text_config", config)
    heads = getattr(text, "num_attention_heads", None)
    hidden = getattr(text, "hidden_size", None)
    if not heads or not hidden:
        return
    # vLLM's Qwen2 derives the head size from hidden_size / heads (it ignores head_dim).
    head = hidden // heads
    if text.model_type not in ("qwen2",):
        head = getattr(text, "head_dim", None) or head
    if head not in CPU_HEAD_SIZES:
        msg = (
            f"[rollout] vLLM's CPU attention does not support head size {head} of "
            f"{spec.model_path!r} (hidden_size {hidden} / {heads} heads); supported: "
            f"{', '.join(map(str, CPU_HEAD_SIZES))}. Use rollout.name = 'hf' or another model"
        )
        raise ConfigError(msg)


def special_ids(spec: RolloutSpec, config: Any) -> tuple[list[int], int]:
    """EOS ids (generation config + model config + tokenizer) and the pad id.

    The same sources, in the same order, as the HF rollout: both stop on the same tokens.
    """
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(spec.model_path)
    except OSError:
        gen = None
    return core_special_ids(
        spec.model_path,
        trust_remote_code=spec.trust_remote_code,
        eos=(gen.eos_token_id if gen else None, getattr(config, "eos_token_id", None)),
        pad=gen.pad_token_id if gen is not None else None,
    )
