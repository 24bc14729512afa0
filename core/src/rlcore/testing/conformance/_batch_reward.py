"""``check_batch_reward``: a batched scorer returns one finite score per row, in time."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rlcore.errors import RewardError
from rlcore.interfaces import BaseBatchReward, RewardBatch
from rlcore.testing.conformance._common import check_time_limit, fail
from rlcore.testing.conformance._contract import check_class, construct
from rlcore.testing.conformance._reward import ADVERSARIAL_INPUTS

__all__ = ["check_batch_reward", "make_reward_batch"]

# The adversarial texts a batched scorer sees by default: a few of the per-sample ones (the
# 100 kB ones too: a judge's prompt must cope with them) and a plain answer.
_DEFAULT_ROWS: tuple[tuple[str, str], ...] = (
    ("so 3 + 4 = 7\n#### 7", "7"),
    *((s, g) for _, s, g in ADVERSARIAL_INPUTS[:4]),
    *((s, g) for _, s, g in ADVERSARIAL_INPUTS[-4:]),
)


def make_reward_batch(
    rows: Sequence[tuple[str, str]],
    *,
    tokenizer: Any = None,
    prompt: str = "What is 3 + 4?",
    response_length: int = 8,
    data_source: str = "conformance",
) -> RewardBatch:
    """A :class:`RewardBatch` of ``(response text, ground truth)`` rows, laid out as the
    reward manager lays one out: left-padded prompts, right-padded responses of
    ``response_length`` tokens, ``response_mask`` over each row's tokens.

    With ``tokenizer`` the ids are its encoding of the texts (clipped to
    ``response_length``); without, they are the texts' UTF-8 bytes plus 1 (0 pads).
    """
    import torch

    from rlcore.protocol import DataProto
    from rlcore.reward.batched import reward_batch

    def encode(text: str) -> list[int]:
        if tokenizer is not None:
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return [b + 1 for b in text.encode()]

    B, R = len(rows), response_length
    p_ids = encode(prompt)[-64:] or [1]
    r_ids = [encode(text)[:R] or [1] for text, _ in rows]
    P = len(p_ids)
    prompts = torch.tensor([p_ids] * B, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    mask = torch.zeros(B, R, dtype=torch.float32)
    for i, ids in enumerate(r_ids):
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = 1.0
    attention = torch.cat([torch.ones(B, P, dtype=torch.long), mask.long()], dim=1)
    extras = [{"index": i, "split": "conformance"} for i in range(B)]
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "response_mask": mask,
        },
        non_tensors={
            "data_source": [data_source] * B,
            "reward_model": [{"style": "rule", "ground_truth": g} for _, g in rows],
            "extra_info": extras,
        },
    )
    return reward_batch(
        data,
        list(range(B)),
        prompts=[prompt] * B,
        responses=[text for text, _ in rows],
        response_mask=mask,
        sources=[data_source] * B,
        truths=[g for _, g in rows],
        extra_infos=extras,
    )


def check_batch_reward(
    cls: type[BaseBatchReward],
    config: BaseBatchReward.Config | None = None,
    cases: Iterable[tuple[str, str, float]] = (),
    *,
    tokenizer: Any = None,
    response_length: int = 8,
    time_limit_s: float = 60.0,
) -> None:
    """Check a batched scorer against the :class:`~rlcore.interfaces.BaseBatchReward` contract.

    ``score_batch`` is called on a batch of adversarial rows and on a batch of one row; each
    time it must return a :class:`~rlcore.interfaces.BatchScores` whose ``scores`` hold one
    score per row — (B,) sequence-level or (B, R) token-level, the same kind both times — of
    a floating-point dtype, finite inside the response mask; ``extras`` one value per row;
    ``metrics`` finite numbers; within ``time_limit_s``. ``cases`` are ``(response,
    ground_truth, expected)`` the author knows: each row's score (a token-level scorer's sum
    over the row's valid tokens) must be ``expected``. ``tokenizer`` encodes the texts into
    the batch's ids (without: UTF-8 bytes + 1), for a scorer that reads the ids.
    """
    from rlcore.reward.batched import checked_scores

    what, config = check_class(cls, BaseBatchReward, config, "reward.options")
    scorer = construct(what, cls, config, "batched reward")
    rows = list(_DEFAULT_ROWS) + [(s, g) for s, g, _ in cases]
    batches = [
        ("adversarial rows", rows),
        ("a batch of one row", rows[:1]),
    ]
    kinds: set[int] = set()
    for label, batch_rows in batches:
        batch = make_reward_batch(batch_rows, tokenizer=tokenizer, response_length=response_length)
        start = time.monotonic()
        try:
            result = scorer.score_batch(batch)
        except Exception as err:  # the finding: model output made the scorer raise
            fail(what, "score_batch must not raise", f"{label}: {type(err).__name__}: {err}")
        check_time_limit(what, "score_batch", label, start, time_limit_s)
        try:
            checked = checked_scores(cls.__name__, result, batch)
        except RewardError as err:
            fail(what, "score_batch must return one finite score per row (BatchScores)", str(err))
        kinds.add(0 if checked.token_scores is None else 1)
        if "mean" in checked.metrics:
            fail(
                what,
                "metrics must not be named 'mean' (the manager logs the scores' mean there)",
                label,
            )
        if label == "adversarial rows":
            for i, (text, truth, expected) in enumerate(cases):
                got = float(checked.row_scores[len(_DEFAULT_ROWS) + i])
                if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
                    fail(
                        what,
                        "author case scored wrong",
                        f"case {i} ({text[:60]!r} vs {truth!r}): expected {expected}, got {got}",
                    )
    if len(kinds) > 1:
        fail(
            what,
            "scores must be of one kind: (B,) sequence-level or (B, R) token-level",
            "the two batches got different kinds",
        )
