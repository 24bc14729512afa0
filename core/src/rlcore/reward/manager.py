"""The reward manager: decoded responses in, a token-level score tensor out.

For each row it decodes the valid response tokens, scores the text with the rewards chosen by
the row's ``data_source`` (weighted sum when several), and writes the score on the row's last
valid response token (verl's convention, so sequence-level rewards enter GAE/GRPO as in verl).
A scorer that raises or runs past ``timeout_s`` scores 0 and is counted; the run continues.
Scoring runs in worker processes (:mod:`rlcore.reward.pool`) by default, even for a batch of
one: a scorer stuck in one long C call ignores the alarm, and only a process can be killed.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlcore.errors import ConfigError, DataError
from rlcore.interfaces import BaseReward
from rlcore.reward._scoring import Outcome, Task, alarm_available, alarm_handler, call_reward
from rlcore.reward.pool import ScoringPool

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

__all__ = ["RewardManager"]

log = logging.getLogger(__name__)

# Rows probed in the driver to estimate the cost of a task before a pool is considered.
_PROBE_TASKS = 16


class RewardManager:
    """Scores a batch of responses with rule rewards.

    Args:
        tokenizer: decodes response ids (``batch_decode(ids, skip_special_tokens=True)``).
        rewards: reward objects by name (``{"gsm8k": GSM8KReward(...)}``).
        sources: ``data_source -> reward names`` (``[reward.sources]``).
        default: the reward names for a ``data_source`` not in ``sources``.
        weights: a weight per reward name (default 1.0); a row's score is the weighted sum.
        timeout_s: per-sample time limit of one reward call.
        num_workers: scoring processes. 0: one per CPU (at most 8); 1: never a pool (scoring
            in the driver, where a scorer stuck in C code cannot be stopped).
        pool_min_batch: fewer reward calls than this are scored in the driver. Default 0:
            every call goes to the pool, because only there can a scorer stuck in one long
            C call (``sum(range(10**13))``, a huge ``int`` power: the alarm cannot interrupt
            them) be killed; in the driver it would hang the run.
        pool_min_seconds: with ``pool_min_batch > 0``, the pool is used only when scoring in
            the driver is estimated (from the measured cost of recent calls) to take at
            least this long; starting a task in a worker costs ~0.1 ms, more than a GSM8K
            regex. An opt-in speed trade for rewards known never to block in C.

    Call it on a batch with ``prompts`` (B, P), ``responses`` (B, R), ``attention_mask``
    (B, P+R) and/or ``response_mask`` (B, R), and per-row ``data_source`` and
    ``reward_model`` (``{"ground_truth": ...}``), optionally ``extra_info``. It returns a new
    DataProto to ``union`` into the batch, and metrics:

    - ``token_level_scores`` (B, R) float32: the score at the last valid response token;
    - ``score`` (per row, combined), ``acc`` (the reward's ``acc`` or else ``score > 0``),
      ``pred`` and any other extra a reward returns (None where a row's rewards gave none),
      and ``score/<name>`` per reward when there are several (NaN where not used);
    - metrics ``reward/timeouts``, ``reward/errors``, ``reward/empty_responses`` (counts in
      this batch), ``reward/<data_source>/score``, ``.../acc`` (means), ``.../count``, and
      ``reward/reason/<reason>``: how many rows' extras have that string ``reason`` (the
      code reward's ``pass``, ``timeout``, ...; only reasons seen in the batch appear).
    """

    def __init__(
        self,
        tokenizer: Any,
        rewards: Mapping[str, BaseReward],
        sources: Mapping[str, Sequence[str]] | None = None,
        default: Sequence[str] | str = (),
        weights: Mapping[str, float] | None = None,
        timeout_s: float = 5.0,
        num_workers: int = 0,
        pool_min_batch: int = 0,
        pool_min_seconds: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.rewards = dict(rewards)
        self.sources = {ds: _names(v) for ds, v in (sources or {}).items()}
        self.default = _names(default)
        self.weights = dict(weights or {})
        for where, names in [("[reward] default", self.default)] + [
            (f"[reward.sources] {ds!r}", v) for ds, v in self.sources.items()
        ]:
            for name in names:
                if name not in self.rewards:
                    msg = (
                        f"reward {name!r} in {where} is not configured; "
                        f"configured: {', '.join(sorted(self.rewards)) or 'none'}"
                    )
                    raise ConfigError(msg)
        for name, w in self.weights.items():
            if name not in self.rewards:
                msg = f"[reward.weights] names {name!r}, which is not a configured reward"
                raise ConfigError(msg)
            if not math.isfinite(w):
                msg = f"[reward.weights] {name!r} must be finite, got {w}"
                raise ConfigError(msg)
        if timeout_s <= 0:
            msg = f"[reward] timeout_s must be > 0, got {timeout_s}"
            raise ConfigError(msg)
        if num_workers < 0:
            msg = f"[reward] num_workers must be >= 0, got {num_workers}"
            raise ConfigError(msg)
        self.timeout_s = timeout_s
        self.num_workers = num_workers if num_workers else min(8, os.cpu_count() or 1)
        self.pool_min_batch = pool_min_batch
        self.pool_min_seconds = pool_min_seconds
        self._pool: ScoringPool | None = None
        self._pool_failed = num_workers == 1
        self._seconds_per_task: float | None = None  # running estimate, driver-side cost
        self._warned_no_limit = False

    # --- public -----------------------------------------------------------------------------

    def __call__(self, data: DataProto) -> tuple[DataProto, dict[str, float]]:
        import torch

        from rlcore.protocol import DataProto

        responses = _tensor(data, "responses")  # (B, R)
        B, R = responses.shape
        # Valid tokens run through the last 1 of the mask (a multi-turn mask may have holes):
        # decode responses[i, :ends[i]] and put the score at ends[i] - 1.
        ends = _ends(_response_mask(data, R))  # (B,) int64, 0 for an empty response
        sources = _column(data, "data_source")
        truths = [_ground_truth(rm, i) for i, rm in enumerate(_column(data, "reward_model"))]
        extras_in = data.non_tensor_batch.get("extra_info")
        # A multi-turn rollout ([agent]) adds each conversation's turns and tool counts; the
        # reward sees them in extra_info (keys "turns", "tool_calls", "tool_errors", ...).
        agent_in = data.non_tensor_batch.get("agent")

        lens: list[int] = ends.tolist()
        # numpy rows, not lists: transformers type-checks every int of a list (10x slower).
        ids_np = responses.detach().cpu().numpy()
        ids = [ids_np[i, :n] for i, n in enumerate(lens)]
        texts = _decode(self.tokenizer, ids)

        # --- one task per (row, reward) ---------------------------------------------------
        tasks: list[Task] = []
        owner: list[int] = []
        for i in range(B):
            if lens[i] == 0:
                continue  # nothing generated: score 0, no token to put it on
            extra = extras_in[i] if extras_in is not None else None
            extra = dict(extra) if isinstance(extra, Mapping) else None
            if agent_in is not None and isinstance(agent_in[i], Mapping):
                extra = {**(extra or {}), **agent_in[i]}
            for name in self._names_for(str(sources[i])):
                tasks.append((len(tasks), name, str(sources[i]), texts[i], truths[i], extra))
                owner.append(i)
        outcomes = self._run(tasks)

        # --- combine per row --------------------------------------------------------------
        scores = np.zeros(B, dtype=np.float64)
        extras: list[dict[str, Any]] = [{} for _ in range(B)]
        per_reward: dict[str, np.ndarray] = {}
        if len(self.rewards) > 1:
            per_reward = {name: np.full(B, np.nan) for name in self.rewards}
        timeouts = errors = 0
        first_problem = ""
        for task, i, (status, value, extra_out, message, _) in zip(tasks, owner, outcomes):
            name = task[1]
            if status != "ok":
                timeouts += status == "timeout"
                errors += status == "error"
                first_problem = first_problem or f"{message} (data_source {task[2]!r})"
            scores[i] += self.weights.get(name, 1.0) * value
            for key, v in extra_out.items():
                extras[i].setdefault(key, v)  # the first reward listed wins
            if name in per_reward:
                per_reward[name][i] = value
        if first_problem:
            log.warning(
                "reward: %d timeouts, %d errors in %d calls; first: %s",
                timeouts, errors, len(tasks), first_problem,
            )  # fmt: skip

        acc = np.array([bool(e.get("acc", s > 0)) for e, s in zip(extras, scores)])
        # Score at the last valid response token; (B, R). Rows without one keep zeros.
        token_level_scores = torch.zeros(B, R, dtype=torch.float32)
        rows = np.flatnonzero(ends)
        token_level_scores[rows, ends[rows] - 1] = torch.as_tensor(
            scores[rows], dtype=torch.float32
        )

        non_tensors: dict[str, Any] = {
            "score": _objects(scores.tolist()),
            "acc": _objects(acc.tolist()),
        }
        for key in sorted({k for e in extras for k in e} - {"acc", "score"}):
            non_tensors[key] = _objects([e.get(key) for e in extras])
        for name, arr in per_reward.items():
            non_tensors[f"score/{name}"] = _objects(arr.tolist())

        metrics: dict[str, float] = {
            "reward/timeouts": float(timeouts),
            "reward/errors": float(errors),
            "reward/empty_responses": float(lens.count(0)),
        }
        # A reward may say why a row scored as it did ({"reason": "timeout"}); counted per batch.
        reasons = collections.Counter(r for e in extras if isinstance(r := e.get("reason"), str))
        for reason, count in sorted(reasons.items()):
            metrics[f"reward/reason/{reason}"] = float(count)
        src = np.array([str(s) for s in sources], dtype=object)
        for ds in sorted(set(src.tolist())):
            sel = src == ds
            metrics[f"reward/{ds}/score"] = float(scores[sel].mean())
            metrics[f"reward/{ds}/acc"] = float(acc[sel].mean())
            metrics[f"reward/{ds}/count"] = float(sel.sum())
        out = DataProto.from_dict(
            tensors={"token_level_scores": token_level_scores}, non_tensors=non_tensors
        )
        return out, metrics

    def close(self) -> None:
        """Stop the scoring processes, if any were started."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- scoring ----------------------------------------------------------------------------

    def _names_for(self, data_source: str) -> list[str]:
        names = self.sources.get(data_source, self.default)
        if not names:
            msg = (
                f"no reward for data_source {data_source!r}: add it to [reward.sources] "
                f"(known: {', '.join(sorted(self.sources)) or 'none'}) or set [reward] default"
            )
            raise ConfigError(msg)
        return names

    def _run(self, tasks: list[Task]) -> list[Outcome]:
        """Score all tasks: in the driver, or in the pool when it pays (or is needed)."""
        results: list[Outcome | None] = [None] * len(tasks)
        can_alarm = alarm_available()
        start = 0
        if can_alarm and self._seconds_per_task is None and self.pool_min_batch > 0:
            # Probe a few tasks here to learn what a task costs before deciding.
            start = min(_PROBE_TASKS, len(tasks))
            results[:start] = self._run_inline(tasks[:start], can_alarm)
        rest = tasks[start:]
        if rest and self._want_pool(len(rest), can_alarm):
            pool = self._get_pool()
            if pool is not None:
                # The pool takes ids 0..n-1; renumber and map back.
                renumbered = [(k, *t[1:]) for k, t in enumerate(rest)]
                results[start:] = pool.run(renumbered)
                # Keep the cost estimate current from the workers' own timings.
                spent = [r[4] for r in results[start:] if r is not None]
                if spent:
                    self._update_estimate(sum(spent) / len(spent))
                if pool.broken:
                    self._pool_failed = True
        missing = [k for k in range(start, len(tasks)) if results[k] is None]
        if missing:
            for k, outcome in zip(
                missing, self._run_inline([tasks[k] for k in missing], can_alarm)
            ):
                results[k] = outcome
        done = [r for r in results if r is not None]
        if len(done) != len(tasks):  # pragma: no cover - every path above fills all
            msg = "reward manager lost a task"
            raise RuntimeError(msg)
        return done

    def _want_pool(self, n: int, can_alarm: bool) -> bool:
        if self._pool_failed:
            return False
        if not can_alarm:
            return True  # off the main thread only a worker process can enforce the limit
        if n < self.pool_min_batch:
            return False
        estimate = (self._seconds_per_task or 0.0) * n
        return estimate >= self.pool_min_seconds

    def _get_pool(self) -> ScoringPool | None:
        if self._pool is None:
            try:
                self._pool = ScoringPool(self.rewards, self.num_workers, self.timeout_s)
            except Exception as err:  # unpicklable reward: keep scoring in the driver
                log.warning("reward pool unavailable (%s: %s); scoring in the driver",
                            type(err).__name__, err)  # fmt: skip
                self._pool_failed = True
                return None
        return self._pool

    def _run_inline(self, tasks: list[Task], can_alarm: bool) -> list[Outcome]:
        if not tasks:
            return []
        t0 = time.perf_counter()
        if can_alarm:
            with alarm_handler():
                out = [call_reward(self.rewards, t, self.timeout_s) for t in tasks]
        else:
            if not self._warned_no_limit:
                log.warning(
                    "reward: scoring off the main thread without a pool (num_workers=1); "
                    "the %s s time limit cannot be enforced", self.timeout_s,
                )  # fmt: skip
                self._warned_no_limit = True
            out = [call_reward(self.rewards, t, None) for t in tasks]
        self._update_estimate((time.perf_counter() - t0) / len(tasks))
        return out

    def _update_estimate(self, per_task: float) -> None:
        prev = self._seconds_per_task
        self._seconds_per_task = per_task if prev is None else 0.5 * prev + 0.5 * per_task


# --- helpers ----------------------------------------------------------------------------------


def _decode(tokenizer: Any, ids: list[np.ndarray]) -> list[str]:
    """``tokenizer.batch_decode(ids, skip_special_tokens=True)``, faster when it is the same.

    transformers type-checks every id in Python before handing them to the Rust tokenizer
    (most of the manager's time on a GSM8K batch); with no clean-up of tokenization spaces
    (Qwen, Llama), calling the Rust tokenizer directly gives the same text.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        texts: list[str] = backend.decode_batch(
            [row.tolist() for row in ids], skip_special_tokens=True
        )
        return texts
    return list(tokenizer.batch_decode(ids, skip_special_tokens=True))


def _names(value: Sequence[str] | str) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _tensor(data: DataProto, key: str) -> torch.Tensor:
    if key not in data.batch:
        msg = f"reward manager: the batch has no {key!r} tensor (has: {sorted(data.batch)})"
        raise DataError(msg)
    return data.batch[key]


def _column(data: DataProto, key: str) -> np.ndarray:
    if key not in data.non_tensor_batch:
        msg = (
            f"reward manager: the batch has no per-row {key!r} "
            f"(has: {sorted(data.non_tensor_batch)}); prepare data with verl's row schema"
        )
        raise DataError(msg)
    return data.non_tensor_batch[key]


def _response_mask(data: DataProto, R: int) -> np.ndarray:
    """(B, R) bool: ``response_mask``, else the response part of ``attention_mask``."""
    if "response_mask" in data.batch:
        mask = data.batch["response_mask"]
    elif "attention_mask" in data.batch:
        attn = data.batch["attention_mask"]
        mask = attn[:, attn.shape[1] - R :]
    else:
        msg = "reward manager: the batch has neither 'response_mask' nor 'attention_mask'"
        raise DataError(msg)
    return np.asarray(mask.detach().cpu().numpy() != 0)


def _ends(mask: np.ndarray) -> np.ndarray:
    """(B,) index after the last True of each row of a (B, R) bool mask; 0 if none."""
    B, R = mask.shape
    if R == 0:
        return np.zeros(B, dtype=np.int64)
    from_end = mask[:, ::-1].argmax(axis=1)  # the first True from the right
    return np.where(mask.any(axis=1), R - from_end, 0).astype(np.int64)


def _ground_truth(reward_model: Any, row: int) -> Any:
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    msg = f"reward manager: row {row} has no reward_model.ground_truth (got {reward_model!r})"
    raise DataError(msg)
