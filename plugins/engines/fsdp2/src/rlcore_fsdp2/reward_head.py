"""The reward model's forward: a sequence-classification model's score at each row's end.

verl's reward-model worker reads a one-label head's output at the last attended token. A
``...ForSequenceClassification`` model pools by ``pad_token_id`` itself (the rightmost token
that is not the pad id), which is wrong when a row ends with a token equal to the pad id
(pad = eos in many tokenizers). Here a forward hook on the head (``score``) takes its
per-token outputs (b, T, 1) and the score is read at each row's last attended position.
Rows are left-padded (:func:`rlcore.reward.model.rm_inputs`), scored padded (not packed).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from rlcore.errors import ConfigError
from rlcore.protocol import DataProto
from rlcore_fsdp2.batching import trim_left_padding

__all__ = ["HEAD", "check_reward_head", "score_rows"]

#: The one-label head of transformers' sequence classifiers (Llama, Qwen2/3, Mistral, Gemma).
HEAD = "score"


def check_reward_head(model: torch.nn.Module, model_path: str) -> None:
    """A one-label ``score`` head, else one line naming ``reward_model.model.path``."""
    head = getattr(model, HEAD, None)
    if not isinstance(head, torch.nn.Linear):
        msg = (
            f"reward_model.model.path: {type(model).__name__} from {model_path} has no "
            f"'{HEAD}' head; rlcore reads the head transformers' generic sequence "
            "classifiers have (Llama, Qwen2, Mistral, ...)"
        )
        raise ConfigError(msg)
    if head.out_features != 1:
        msg = (
            f"reward_model.model.path: {model_path} has {head.out_features} labels; a reward "
            "model scores with one (num_labels = 1)"
        )
        raise ConfigError(msg)


def _rows_per_pass(batch: DataProto, micro_batch_size: int | None, max_tokens: int | None) -> int:
    if micro_batch_size is not None:
        return micro_batch_size
    assert max_tokens is not None
    width = int(batch.batch["attention_mask"].shape[1]) or 1
    return max(1, max_tokens // width)


def score_rows(
    model: torch.nn.Module,
    batch: DataProto,
    device: torch.device,
    *,
    micro_batch_size: int | None,
    max_tokens_per_micro_batch: int | None,
) -> torch.Tensor:
    """(B,) float32 on CPU: the head's output at each row's last attended token, no grad.

    Every rank runs the same number of forwards (FSDP's all-gathers are collective): the
    most any rank needs, with a one-row pass where a rank has run out of rows.
    """
    n = len(batch)
    rows = _rows_per_pass(batch, micro_batch_size, max_tokens_per_micro_batch)
    passes = torch.tensor([math.ceil(n / rows)], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(passes, op=dist.ReduceOp.MAX)
    captured: dict[str, torch.Tensor] = {}

    def keep(module: Any, args: Any, output: torch.Tensor) -> None:
        captured["logits"] = output

    head: torch.nn.Module = getattr(model, HEAD)
    handle = head.register_forward_hook(keep)
    scores: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            for i in range(int(passes.item())):
                real = i * rows < n
                mb = batch.slice(i * rows, min(n, (i + 1) * rows)) if real else batch.slice(0, 1)
                ids, mask, pos = trim_left_padding(
                    mb.batch["input_ids"], mb.batch["attention_mask"], mb.batch["position_ids"]
                )
                mask = mask.to(device)
                model(
                    input_ids=ids.to(device),
                    attention_mask=mask,
                    position_ids=pos.to(device),
                    use_cache=False,
                )
                if not real:
                    continue
                logits = captured.pop("logits")[..., 0]  # (b, T)
                T = mask.shape[1]
                last = T - 1 - mask.flip(dims=[1]).to(torch.int8).argmax(dim=1)
                scores.append(logits[torch.arange(len(last), device=device), last].float().cpu())
    finally:
        handle.remove()
    return torch.cat(scores) if scores else torch.zeros(0)
