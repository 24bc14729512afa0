"""Next-token distributions of a transformers causal LM over the response positions.

What a transformers-backed rollout (HF) or engine (FSDP2) returns from
``next_token_distributions``, for the training-inference consistency check
(:func:`rlcore.testing.conformance.check_consistency`). Runs in the process that holds the
model; one forward for both plugins.
"""

from __future__ import annotations

from typing import Any

import torch

from rlcore.interfaces import TokenDistributions
from rlcore.protocol import DataProto

__all__ = ["decoder_layers", "hf_next_token_distributions"]


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers in order, found as FSDP2 finds them (``_no_split_modules``).

    Matched over each module's class hierarchy: ``fully_shard`` swaps a layer's class for a
    subclass named ``FSDP<Layer>``.
    """
    inner: Any = getattr(model, "base_model", model)  # a peft wrapper
    names = set(getattr(inner, "_no_split_modules", None) or [])
    names |= set(getattr(getattr(inner, "model", None), "_no_split_modules", None) or [])
    return [m for m in model.modules() if any(c.__name__ in names for c in type(m).__mro__)]


@torch.no_grad()
def hf_next_token_distributions(
    model: torch.nn.Module, batch: DataProto, device: torch.device, *, hidden_states: bool
) -> TokenDistributions:
    """Logits (B, R, V) predicting ``responses`` and, when asked, each decoder layer's
    output (B, R, H) at the same positions; float32 on CPU."""
    b = batch.batch
    r = int(b["responses"].shape[1])
    captured: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, out: Any) -> None:
        # transformers 5 layers return the residual stream; older ones a tuple led by it.
        h = out[0] if isinstance(out, tuple) else out
        captured.append(h[:, -(r + 1) : -1].float().cpu())

    layers = decoder_layers(model) if hidden_states else []
    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        out = model(
            input_ids=b["input_ids"].to(device),
            attention_mask=b["attention_mask"].to(device),
            position_ids=b["position_ids"].to(device),
            use_cache=False,
            logits_to_keep=r + 1,
        )
    finally:
        for handle in handles:
            handle.remove()
    logits = out.logits[:, -(r + 1) : -1].float().cpu()
    return TokenDistributions(logits=logits, hidden_states=captured if hidden_states else None)
