"""Generation that shares the prompt: each distinct prompt is prefilled once.

GRPO's ``n`` samples of a prompt reach the rollout as ``n`` identical adjacent rows (the
driver repeats with ``interleave``). ``generate`` would prefill every row; under
:func:`shared_prefill` the model's first forward (the prefill) runs on the first row of each
run of identical rows only, and its KV cache and last-position logits are then copied to the
run's other rows, so decoding proceeds exactly as before: the same batch, the same random
draws (``torch.multinomial`` over the same ``(rows, vocab)`` probabilities at every step),
the same tokens wherever the prefill of a row does not depend on which other rows share its
batch (true of the float32 CPU kernels measured here; see ``benchmarks/shared_prefill.py``).

Rows are grouped by content (token ids and attention mask), not by ``uid``: two rows share a
prefill only if they are the same prompt, whatever produced them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["SharedPrefill", "prompt_groups", "shared_prefill"]

# Keyword arguments of a causal LM's forward whose first dimension is the batch.
_BATCH_KEYS = ("input_ids", "attention_mask", "position_ids", "inputs_embeds", "token_type_ids")


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(firsts, owner)`` for runs of identical adjacent rows, or None if no row repeats.

    ``firsts``: the index of each run's first row, ``(G,)``; ``owner``: each row's run,
    ``(B,)``, so row ``i`` is prompt ``firsts[owner[i]]``.
    """
    if input_ids.shape[0] < 2:
        return None
    same = (input_ids[1:] == input_ids[:-1]).all(-1) & (
        attention_mask[1:] == attention_mask[:-1]
    ).all(-1)
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero().squeeze(1), starts.long().cumsum(0) - 1


class SharedPrefill:
    """What :func:`shared_prefill` did: ``prompts`` prefilled for ``rows`` rows (0: not yet)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.prompts = 0


@contextlib.contextmanager
def shared_prefill(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> Iterator[SharedPrefill | None]:
    """Within the block, ``model``'s next forward on ``input_ids`` prefills distinct rows once.

    Yields None (and changes nothing) when no row repeats. The patched ``forward`` is an
    instance attribute removed on its first call or on leaving the block; any other first
    call (a shape that is not the prompt batch) runs unchanged.
    """
    groups = prompt_groups(input_ids, attention_mask)
    if groups is None:
        yield None
        return
    firsts, owner = (t.to(input_ids.device) for t in groups)
    forward = model.forward
    record = SharedPrefill(rows=input_ids.shape[0])

    @functools.wraps(forward)  # keeps forward's signature: generate inspects it
    def prefill_once(**kwargs: Any) -> Any:
        del model.forward
        ids = kwargs.get("input_ids")
        if ids is None or ids.shape != input_ids.shape:
            return forward(**kwargs)
        for name in _BATCH_KEYS:
            if isinstance(kwargs.get(name), torch.Tensor):
                kwargs[name] = kwargs[name].index_select(0, firsts)
        out = forward(**kwargs)
        cache = kwargs.get("cache") or kwargs.get("past_key_values") or _output_cache(out)
        cache.batch_select_indices(owner)
        out.logits = out.logits.index_select(0, owner)
        record.prompts = len(firsts)
        return out

    model.forward = prefill_once
    try:
        yield record
    finally:
        model.__dict__.pop("forward", None)


def _output_cache(out: Any) -> Any:
    """The cache a forward returned: ``cache`` (transformers >= 5.24) or ``past_key_values``."""
    cache = out.get("cache") if "cache" in out else out.get("past_key_values")
    if cache is None:
        msg = "shared prompt prefill: the prefill returned no KV cache to expand"
        raise RuntimeError(msg)
    return cache
