"""Batched scorers (:class:`~rlcore.interfaces.BaseBatchReward`) inside the reward manager.

:func:`reward_batch` lays out the rows a scorer gets, :func:`call_batched` calls it in the
driver under ``[reward] batch_timeout_s`` and :func:`checked_scores` reads what it returned:
one score per row, (B,) or (B, R), finite, plus per-row extras and metrics. Every failure is
one :class:`~rlcore.errors.RewardError` naming the scorer: a batched scorer is a model or a
remote service, whose failure is the whole batch's, so the run stops instead of scoring 0.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from rlcore.errors import RewardError
from rlcore.interfaces import BatchScores, RewardBatch

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import BaseBatchReward
    from rlcore.protocol import DataProto

__all__ = ["ScorerResult", "call_batched", "checked_scores", "reward_batch"]

BATCH_TIMEOUT_KEY = "reward.batch_timeout_s"


def reward_batch(
    data: DataProto,
    rows: Sequence[int],
    *,
    prompts: Sequence[str],
    responses: Sequence[str],
    response_mask: torch.Tensor,
    sources: Sequence[str],
    truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None],
) -> RewardBatch:
    """The :class:`RewardBatch` of ``rows`` of ``data``; the text and per-row lists are the
    whole batch's (length ``len(data)``), ``response_mask`` (B, R) float32."""
    import torch

    idx = torch.as_tensor(list(rows), dtype=torch.long)
    every = len(rows) == len(data) and list(rows) == list(range(len(data)))
    responses_t = data.batch["responses"]
    if "prompts" in data.batch:
        prompt_ids = data.batch["prompts"]
    else:  # the prompt part of input_ids (P = input length - R)
        input_ids = data.batch["input_ids"]
        prompt_ids = input_ids[:, : input_ids.shape[1] - responses_t.shape[1]]
    if "attention_mask" in data.batch:
        attention_mask = data.batch["attention_mask"]
    else:
        prompt_ones = torch.ones_like(prompt_ids)
        attention_mask = torch.cat([prompt_ones, response_mask.to(prompt_ones.dtype)], dim=1)
    return RewardBatch(
        prompts=tuple(prompts[i] for i in rows),
        responses=tuple(responses[i] for i in rows),
        prompt_ids=prompt_ids[idx],
        response_ids=responses_t[idx],
        attention_mask=attention_mask[idx],
        response_mask=response_mask[idx],
        data_sources=tuple(sources[i] for i in rows),
        ground_truths=tuple(truths[i] for i in rows),
        extra_infos=tuple(extra_infos[i] for i in rows),
        data=data if every else data.select_idxs(idx),
    )


def call_batched(
    name: str, scorer: BaseBatchReward, batch: RewardBatch, timeout_s: float | None
) -> Any:
    """``scorer.score_batch(batch)`` in the driver, within ``timeout_s`` (None: no limit).

    With a limit the call runs in a daemon thread: a scorer past it cannot be stopped (a
    model's forward, a socket read), but the run stops with an error instead of hanging, and
    the thread does not keep the process alive.
    """
    what = f"reward {name!r} ({type(scorer).__qualname__}.score_batch)"
    if timeout_s is None:
        try:
            return scorer.score_batch(batch)
        except RewardError:
            raise
        except Exception as err:  # the scorer's own code: name it
            msg = f"{what} raised {type(err).__name__}: {err}"
            raise RewardError(msg) from err
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = scorer.score_batch(batch)
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"reward-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        msg = (
            f"{what} did not return within {BATCH_TIMEOUT_KEY} = {timeout_s:g} s "
            f"({len(batch)} rows); raise the limit or make the scorer faster"
        )
        raise RewardError(msg)
    if "error" in box:
        failure: BaseException = box["error"]
        if isinstance(failure, RewardError):
            raise failure
        msg = f"{what} raised {type(failure).__name__}: {failure}"
        raise RewardError(msg) from failure
    return box["result"]


@attrs.frozen(kw_only=True)
class ScorerResult:
    """A batched scorer's checked output over its B rows: ``row_scores`` (B,) float64 (a
    token-level scorer's sum over the valid tokens), ``token_scores`` (B, R) float32 with
    zeros outside the mask for a token-level scorer, else None, ``extras`` one dict per row,
    ``metrics`` by key."""

    row_scores: np.ndarray
    token_scores: torch.Tensor | None
    extras: list[dict[str, Any]]
    metrics: dict[str, float]


def checked_scores(name: str, result: Any, batch: RewardBatch) -> ScorerResult:
    """What ``score_batch`` returned, checked against the contract of
    :class:`~rlcore.interfaces.BatchScores`; a :class:`RewardError` names the scorer and rule."""
    import torch

    what = f"reward {name!r}: score_batch"
    B, R = batch.response_ids.shape
    if not isinstance(result, BatchScores):
        msg = f"{what} must return rlcore.interfaces.BatchScores, got {type(result).__name__}"
        raise RewardError(msg)
    scores = result.scores
    if isinstance(scores, np.ndarray):
        scores = torch.from_numpy(scores)
    if not isinstance(scores, torch.Tensor):
        msg = f"{what} returned scores of type {type(scores).__name__}; expected a tensor"
        raise RewardError(msg)
    if tuple(scores.shape) not in ((B,), (B, R)):
        msg = (
            f"{what} returned scores of shape {tuple(scores.shape)} for {B} rows; expected "
            f"({B},) (one score per row) or ({B}, {R}) (token-level, aligned with responses)"
        )
        raise RewardError(msg)
    if not scores.is_floating_point():
        msg = f"{what} returned scores of dtype {scores.dtype}; expected a floating-point dtype"
        raise RewardError(msg)
    scores = scores.detach().to("cpu", torch.float64)
    token_scores: torch.Tensor | None = None
    if scores.ndim == 2:
        valid = batch.response_mask.to("cpu") != 0
        scores = torch.where(valid, scores, torch.zeros((), dtype=scores.dtype))
        token_scores = scores
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        msg = (
            f"{what} returned a non-finite score for row {row} "
            f"(data_source {batch.data_sources[row]!r}): {scores[row].tolist()}"
        )
        raise RewardError(msg)
    row_scores = (scores.sum(-1) if token_scores is not None else scores).numpy()
    extras: list[dict[str, Any]] = [{} for _ in range(B)]
    if not isinstance(result.extras, Mapping):
        msg = f"{what} returned extras of type {type(result.extras).__name__}; expected a dict"
        raise RewardError(msg)
    for key, values in result.extras.items():
        if isinstance(values, np.ndarray | torch.Tensor):
            values = values.tolist()
        if not isinstance(key, str) or isinstance(values, str | bytes):
            msg = f"{what} extras must map a name to one value per row, got {key!r}: {values!r}"
            raise RewardError(msg)
        values = list(values)
        if len(values) != B:
            msg = f"{what} returned extras {key!r} with {len(values)} values for {B} rows"
            raise RewardError(msg)
        if key == "score":
            msg = f"{what} extras must not be named 'score' (the scores field holds them)"
            raise RewardError(msg)
        for i, value in enumerate(values):
            extras[i][key] = value
    metrics: dict[str, float] = {}
    for key, value in dict(result.metrics).items():
        number = isinstance(value, int | float) or hasattr(value, "__float__")
        if not isinstance(key, str) or isinstance(value, str) or not number:
            msg = f"{what} metrics must map a name to a number, got {key!r}: {value!r}"
            raise RewardError(msg)
        if not math.isfinite(float(value)):
            msg = f"{what} returned a non-finite metric {key!r}: {value}"
            raise RewardError(msg)
        metrics[key] = float(value)
    if token_scores is not None:
        token_scores = token_scores.to(torch.float32)
    return ScorerResult(
        row_scores=row_scores.astype(np.float64),
        token_scores=token_scores,
        extras=extras,
        metrics=metrics,
    )
