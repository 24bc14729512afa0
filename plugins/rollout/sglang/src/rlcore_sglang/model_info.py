"""What SGLang needs to know of the model folder before it starts: its EOS and pad ids."""

from __future__ import annotations

import logging
from typing import Any

from rlcore.engine.tokenizer import special_ids
from rlcore.interfaces import (
    RolloutSpec,
)

log = logging.getLogger(__name__)


def special_token_ids(spec: RolloutSpec) -> tuple[list[int], int]:
    """EOS ids (generation config, config, tokenizer) and the pad id, from the model folder.

    The same sources as the HF rollout, without loading the model.
    """
    from transformers import AutoConfig, GenerationConfig

    trust = spec.trust_remote_code
    config = AutoConfig.from_pretrained(spec.model_path, trust_remote_code=trust)
    eos: list[Any] = [config.eos_token_id]
    pad = getattr(config, "pad_token_id", None)
    try:
        gen = GenerationConfig.from_pretrained(spec.model_path)
    except OSError:  # a folder without generation_config.json
        pass
    else:
        eos.insert(0, gen.eos_token_id)
        pad = gen.pad_token_id if gen.pad_token_id is not None else pad
    return special_ids(spec.model_path, trust_remote_code=trust, eos=eos, pad=pad)
