"""The reward model's side of the reward manager: its inputs, its scores, its agreement metric.

A reward model (``[reward_model]``, the role ``rm`` of :mod:`rlcore.roles.reward_model`) is
a sequence-classification model served by a training engine's forward. Each step it runs as
phase ``rm`` (``compute_rm_score``, verl's name) and leaves ``rm_scores`` (B, R) in the batch:
its score on each row's last valid response token. The reward manager then treats it as one
more batched scorer, named ``rm`` (:class:`RewardModelScores`): weighted with the rule rewards
(``[reward_model] weight``), logged as ``reward/scorer/rm/mean``.

Its tokenizer may differ from the policy's. :func:`rm_inputs` then decodes each row's prompt
and response and encodes them again with the reward model's tokenizer, through its chat
template when it has one and the row's ``raw_prompt`` is a conversation (verl's
``_switch_chat_template``); with the same tokenizer the policy's ids are scored as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlcore.engine.rollout_layout import position_ids_from_mask
from rlcore.errors import RewardError
from rlcore.interfaces import BaseBatchReward, BatchScores

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import RewardBatch
    from rlcore.protocol import DataProto

__all__ = [
    "RM_INPUT_KEYS",
    "RM_SCORER",
    "RM_SCORES",
    "RewardModelScores",
    "at_last_token",
    "disagreement",
    "pooled_disagreement",
    "rm_inputs",
    "same_tokenizer",
]

#: The reward model's scorer among the rewards (``[reward]`` may not select this name).
RM_SCORER = "rm"

#: What ``compute_rm_score`` returns: (B, R) float32, the score on the last response token.
RM_SCORES = "rm_scores"

#: The tensors the reward-model role is sent (and ``raw_prompt``, when it re-tokenises).
RM_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


class RewardModelScores(BaseBatchReward):
    """The scorer ``rm``: the ``rm_scores`` the reward-model phase left in the batch.

    Built by the trainer when ``[reward_model] enable`` (never selected by name in
    ``[reward]``); token-level, so the weighted score stays on the token it was put on.
    """

    def score_batch(self, batch: RewardBatch) -> BatchScores:
        scores = batch.data.batch.get(RM_SCORES)
        if scores is None:
            msg = (
                f"reward 'rm': the batch has no {RM_SCORES!r}; the step program must run the "
                "reward model first (ctx.reward(batch), or ctx.phase('rm', "
                "ctx.reward_model.compute_rm_score, ...))"
            )
            raise RewardError(msg)
        return BatchScores(scores=scores.float())


def at_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) scores on each row's last valid response token: (B, R) float32, zeros elsewhere
    (a row with an empty response gets nothing)."""
    import torch

    mask = response_mask != 0
    B, R = mask.shape
    out = torch.zeros(B, R, dtype=torch.float32)
    if R == 0:
        return out
    has = mask.any(dim=1)
    last = R - 1 - mask.flip(dims=[1]).to(torch.int8).argmax(dim=1)
    rows = torch.nonzero(has).flatten()
    out[rows, last[rows]] = scores.detach().to("cpu", torch.float32)[rows]
    return out


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers encode alike: the same vocabulary, special tokens and chat
    template (then the policy's ids are the reward model's ids)."""
    if a is b:
        return True
    keys = ("bos_token", "eos_token", "pad_token", "chat_template")
    if any(getattr(a, k, None) != getattr(b, k, None) for k in keys):
        return False
    return bool(a.get_vocab() == b.get_vocab())


def _valid_ids(ids: torch.Tensor, mask: torch.Tensor) -> list[np.ndarray]:
    ids_np, keep = ids.detach().cpu().numpy(), mask.detach().cpu().numpy() != 0
    return [row[k] for row, k in zip(ids_np, keep)]


def _pad_id(tokenizer: Any) -> int:
    for key in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, key, None)
        if isinstance(value, int):
            return value
    return 0


def rm_inputs(
    data: DataProto,
    *,
    policy_tokenizer: Any,
    rm_tokenizer: Any,
    retokenize: bool,
    max_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """The reward model's ``input_ids``, ``attention_mask``, ``position_ids`` (B, T) for the
    rows of ``data`` (prompt + response, left-padded: each row's last token is at T - 1).

    ``retokenize`` False: the policy's own ``input_ids`` and masks. True: each row's response
    (its valid tokens, special tokens skipped) and prompt are decoded with
    ``policy_tokenizer`` and encoded with ``rm_tokenizer``: through its chat template when it
    has one (``raw_prompt``'s messages, or the decoded prompt as one user message, then the
    response as the assistant's), else as the plain text prompt + response. ``max_length``
    keeps a row's last tokens (where the score is read).
    """
    import torch

    b = data.batch
    if not retokenize:
        return {k: b[k] for k in ("input_ids", "attention_mask", "position_ids")}
    responses, response_mask = b["responses"], b["response_mask"]
    R = responses.shape[1]
    input_ids, attention_mask = b["input_ids"], b["attention_mask"]
    prompt_ids, prompt_mask = input_ids[:, : input_ids.shape[1] - R], attention_mask[:, :-R]
    # The response up to its last valid token (a multi-turn mask may have holes: keep them).
    mask_np = response_mask.detach().cpu().numpy() != 0
    ends = np.where(mask_np.any(1), R - mask_np[:, ::-1].argmax(1), 0)
    resp_np = responses.detach().cpu().numpy()
    response_texts = policy_tokenizer.batch_decode(
        [resp_np[i, :n] for i, n in enumerate(ends)], skip_special_tokens=True
    )
    raw = data.non_tensor_batch.get("raw_prompt")
    chat = getattr(rm_tokenizer, "chat_template", None) is not None
    prompt_texts: list[str] | None = None
    rows: list[list[int]] = []
    for i, response in enumerate(response_texts):
        messages = raw[i] if raw is not None else None
        if chat and isinstance(messages, Sequence) and not isinstance(messages, str):
            conversation = [dict(m) for m in messages if isinstance(m, Mapping)]
        elif chat and isinstance(messages, str):
            conversation = [{"role": "user", "content": messages}]
        else:
            conversation = None
        if conversation is not None:
            conversation.append({"role": "assistant", "content": response})
            text = rm_tokenizer.apply_chat_template(conversation, tokenize=False)
            ids = rm_tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            if prompt_texts is None:
                prompt_texts = policy_tokenizer.batch_decode(
                    _valid_ids(prompt_ids, prompt_mask), skip_special_tokens=True
                )
            ids = rm_tokenizer(prompt_texts[i] + response)["input_ids"]
        if max_length is not None:
            ids = ids[-max_length:]
        rows.append(list(ids) or [_pad_id(rm_tokenizer)])
    T = max(len(r) for r in rows)
    out_ids = torch.full((len(rows), T), _pad_id(rm_tokenizer), dtype=torch.long)
    out_mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, ids in enumerate(rows):
        out_ids[i, T - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
        out_mask[i, T - len(ids) :] = 1
    positions = position_ids_from_mask(out_mask)
    return {"input_ids": out_ids, "attention_mask": out_mask, "position_ids": positions}


def disagreement(
    rm_scores: np.ndarray, rule_acc: Sequence[bool | None], threshold: float
) -> dict[str, float]:
    """How often the reward model's verdict (score > ``threshold``) differs from a rule
    reward's ``acc``, over the rows that have both: ``reward/rm/disagree_rule`` (fraction),
    ``reward/rm/false_accept`` (RM accepts, rule rejects), ``reward/rm/false_reject`` and
    ``reward/rm/compared`` (rows). Empty when no row has both."""
    pairs = [
        (float(s) > threshold, bool(a))
        for s, a in zip(rm_scores, rule_acc)
        if a is not None and not np.isnan(s)
    ]
    if not pairs:
        return {}
    n = len(pairs)
    return {
        "reward/rm/disagree_rule": sum(v != a for v, a in pairs) / n,
        "reward/rm/false_accept": sum(v and not a for v, a in pairs) / n,
        "reward/rm/false_reject": sum(a and not v for v, a in pairs) / n,
        "reward/rm/compared": float(n),
    }


def pooled_disagreement(
    parts: Sequence[Mapping[str, float]], prefix: str = "val/rm/"
) -> dict[str, float]:
    """:func:`disagreement`'s fractions over several batches (each batch's metrics, weighted
    by its ``reward/rm/compared`` rows), under ``prefix``: ``disagree_rule``,
    ``false_accept``, ``false_reject``. Empty when no batch compared a row."""
    keys = ("disagree_rule", "false_accept", "false_reject")
    compared = sum(float(m.get("reward/rm/compared", 0.0)) for m in parts)
    if not compared:
        return {}
    return {
        f"{prefix}{key}": sum(
            float(m.get("reward/rm/compared", 0.0)) * float(m.get(f"reward/rm/{key}", 0.0))
            for m in parts
        )
        / compared
        for key in keys
    }
