"""One micro-batch through the model: padded (b, P+R) or packed (:mod:`rlcore_fsdp2.packing`).

Both return the same :class:`~rlcore.interfaces.ModelOutputs` in the (b, R) response layout:
log-probs and entropy (float32, chunked over tokens) or, with a value head, values. The
actor's update, the old-log-prob pass and the reference pass all come through here.
"""

from __future__ import annotations

import attrs
import torch

from rlcore.interfaces import ModelOutputs
from rlcore.protocol import DataProto
from rlcore_fsdp2.batching import trim_left_padding
from rlcore_fsdp2.logprob import entropy_from_logits, log_probs_from_logits, response_logits
from rlcore_fsdp2.packing import PackedBatch


@attrs.frozen(kw_only=True)
class Scoring:
    """What a forward computes from the model's outputs."""

    value_head: bool
    temperature: float
    with_entropy: bool
    entropy_grad: bool  # entropy with gradient (an entropy term in the loss)
    chunk_tokens: int | None  # tokens per float32 log-softmax chunk; None: one chunk


def padded_forward(
    model: torch.nn.Module, mb: DataProto, device: torch.device, scoring: Scoring
) -> ModelOutputs:
    """The micro-batch as (b, T) rows, columns that are padding in every row trimmed."""
    ids, mask, pos = trim_left_padding(
        mb.batch["input_ids"], mb.batch["attention_mask"], mb.batch["position_ids"]
    )
    ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    responses = mb.batch["responses"].to(device)  # (b, R)
    r = responses.shape[1]
    if scoring.value_head:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        # The value of the state before response token j sits at position P-1+j.
        return ModelOutputs(values=out.logits[:, -(r + 1) : -1, 0].float())  # (b, R)
    # Only the R+1 last positions go through lm_head: (b, R+1, V) instead of (b, P+R, V).
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        use_cache=False,
        logits_to_keep=r + 1,
    )
    return token_outputs(response_logits(out.logits, r), responses, scoring)


def packed_forward(model: torch.nn.Module, packed: PackedBatch, scoring: Scoring) -> ModelOutputs:
    """The micro-batch as one packed sequence; outputs unpacked to (b, R), 0 on padding."""
    if scoring.value_head:
        out = model(**packed.model_kwargs(), use_cache=False)
        return ModelOutputs(values=packed.unpack(out.logits[0, packed.logit_index, 0].float()))
    # Only the M predicting positions go through lm_head: (1, M, V).
    out = model(**packed.model_kwargs(), use_cache=False, logits_to_keep=packed.logit_index)
    outputs = token_outputs(out.logits, packed.labels.unsqueeze(0), scoring)
    assert outputs.log_probs is not None
    outputs.log_probs = packed.unpack(outputs.log_probs[0])
    if outputs.entropy is not None:
        outputs.entropy = packed.unpack(outputs.entropy[0])
    return outputs


def token_outputs(logits: torch.Tensor, labels: torch.Tensor, scoring: Scoring) -> ModelOutputs:
    """Log-probs (and entropy) of (b, n) ``labels`` under (b, n, V) ``logits``."""
    if scoring.temperature not in (0.0, 1.0):  # 0: greedy sampling scores the unscaled logits
        # Sampling used logits / T; log-probs of the same distribution need the same scaling.
        logits = logits / scoring.temperature
    chunk = scoring.chunk_tokens
    outputs = ModelOutputs(log_probs=log_probs_from_logits(logits, labels, chunk))
    if scoring.with_entropy:
        if scoring.entropy_grad:
            outputs.entropy = entropy_from_logits(logits, chunk)
        else:
            with torch.no_grad():
                outputs.entropy = entropy_from_logits(logits.detach(), chunk)
    return outputs
