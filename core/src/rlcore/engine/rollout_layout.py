"""The rollout's input and output layout, each half built in one place so it cannot drift:
the positions of left-padded prompts (:func:`position_ids_from_mask`, also the data loader's
and the reward model's) and the tensors of every rollout's ``generate`` (HF, vLLM, SGLang, the
agent loop; :func:`rollout_tensors`).

Every rollout produces the same layout from left-padded prompts and right-padded responses.
torch is imported by the function (plugin discovery imports nothing heavy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["position_ids_from_mask", "rollout_tensors"]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) int64 positions of left-padded rows: ``cumsum(mask) - 1``, clipped at 0, so a
    padded row sees the positions it would see alone (padding sits at 0, as HF does)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def rollout_tensors(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_pos: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    log_probs: torch.Tensor | None = None,
    response_attention: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``prompts``, ``responses``, ``response_mask``, ``input_ids``, ``attention_mask``,
    ``position_ids`` (and ``rollout_log_probs`` when ``log_probs`` is given, 0 where
    ``response_mask`` is 0).

    ``prompt_*`` are (B, P), ``responses``/``response_mask`` (B, R). The responses' attention
    is ``response_mask`` unless ``response_attention`` says otherwise (the agent loop attends
    to tool turns that get no loss). Response positions continue from the last prompt
    position, also past EOS, where they are masked.
    """
    import torch

    attended = response_mask if response_attention is None else response_attention
    r = responses.shape[1]
    delta = torch.arange(1, r + 1, dtype=prompt_pos.dtype).unsqueeze(0)  # (1, R)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": torch.cat([prompt_mask, attended.to(prompt_mask.dtype)], dim=1),
        "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + delta], dim=1),
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = log_probs * response_mask
    return tensors
