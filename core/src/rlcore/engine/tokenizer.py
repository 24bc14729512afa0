"""The special token ids a rollout stops and pads with, read once from the model folder.

Every rollout (HF, vLLM, SGLang) stops on the same tokens: the model's own EOS ids
(generation config first, then config) and the tokenizer's, and pads with the tokenizer's pad
id. The tokenizer is loaded here, with its one error mapping (a folder without one keeps the
model's ids). transformers is imported by the function.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from rlcore.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["special_ids"]


def special_ids(
    model_path: str, *, trust_remote_code: bool, eos: Iterable[Any], pad: int | None
) -> tuple[list[int], int]:
    """``(eos_ids, pad_id)``: ``eos`` (the model's, each an int, a list or None), then the
    tokenizer's EOS, deduplicated in that order; the tokenizer's pad id, else ``pad``, else
    the first EOS. No EOS anywhere: one line naming the folder."""
    ids: list[int] = []
    for value in eos:
        ids.extend([value] if isinstance(value, int) else list(value or []))
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        log.info("no tokenizer at %s (%s); using the model's special ids", model_path, err)
    else:
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        if tok.pad_token_id is not None:
            pad = tok.pad_token_id
    ids = list(dict.fromkeys(ids))  # dedupe, keep order
    if not ids:
        msg = f"[rollout] no eos_token_id in {model_path} (generation_config, config or tokenizer)"
        raise ConfigError(msg)
    return ids, pad if pad is not None else ids[0]
