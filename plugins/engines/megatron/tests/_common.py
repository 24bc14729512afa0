"""Batches, losses and reference helpers shared by the megatron engine tests."""

from __future__ import annotations

import torch

from rlcore.protocol import DataProto


def make_batch(rows: int = 4, prompt: int = 6, response: int = 5, seed: int = 0) -> DataProto:
    """Left-padded prompts of varied length, right-padded responses with some masked tails."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (rows, prompt + response), generator=g)
    attn = torch.ones(rows, prompt + response, dtype=torch.long)
    resp_mask = torch.ones(rows, response, dtype=torch.long)
    for i in range(rows):
        attn[i, : i % prompt] = 0  # left padding 0..prompt-1
        cut = response - (i % 3)  # 0-2 masked response tokens at the end
        resp_mask[i, cut:] = 0
        attn[i, prompt + cut :] = 0
    ids = ids.masked_fill(attn == 0, 0)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": ids[:, prompt:],
            "response_mask": resp_mask,
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def zero_advantage_batch() -> DataProto:
    """:func:`make_batch` with advantage 0 on rows 0 and 2 (one per data-parallel half)."""
    batch = make_batch()
    batch.batch["advantages"][[0, 2]] = 0.0
    return batch


def token_mean_loss(outputs, mb, totals):
    """Policy-gradient-shaped token-mean loss, normalised by the mini-batch's token count."""
    mask = mb.batch["response_mask"].float()
    loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
    return loss, {"loss": float(loss.detach())}


def hf_logits(model_path: str, batch: DataProto) -> torch.Tensor:
    """transformers' float32 logits (B, T, V) of the batch."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    b = batch.batch
    with torch.no_grad():
        return model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        ).logits.float()


def valid_max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest |a - b| over positions where ``mask`` (B, T) is 1."""
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max())
