"""The reward manager: decoded responses in, a token-level score tensor out.

For each row it decodes the valid response tokens, scores the text with the rewards chosen by
the row's ``data_source`` (weighted sum when several), and writes the score on the row's last
valid response token (verl's convention, so sequence-level rewards enter GAE/GRPO as in verl).
A scorer that raises or runs past ``timeout_s`` scores 0 and is counted; the run continues.
Scoring runs in worker processes (:mod:`rlcore.reward.pool`) by default, even for a batch of
one: a scorer stuck in one long C call ignores the alarm, and only a process can be killed.
Batched scorers (:class:`~rlcore.interfaces.BaseBatchReward`: a model, a remote judge) run in
the driver, one call per batch, and their failure stops the run (:mod:`rlcore.reward.batched`).
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
from rlcore.interfaces import BaseBatchReward, BaseReward
from rlcore.interfaces.reward import BATCH_REWARD_TIMEOUT, REWARD_TIMEOUT
from rlcore.reward._scoring import Outcome, Task, alarm_available, alarm_handler, call_reward
from rlcore.reward.batched import call_batched, checked_scores, reward_batch
from rlcore.reward.model import RM_SCORER, disagreement
from rlcore.reward.pool import ScoringPool

if TYPE_CHECKING:
    import torch

    from rlcore.interfaces import GenerationRole
    from rlcore.protocol import DataProto

__all__ = ["RewardManager"]

log = logging.getLogger(__name__)

# Rows probed in the driver to estimate the cost of a task before a pool is considered.
_PROBE_TASKS = 16


class RewardManager:
    """Scores a batch of responses with per-sample rule rewards and batched scorers.

    Args:
        tokenizer: decodes response ids (``batch_decode(ids, skip_special_tokens=True)``).
        rewards: scorers by name (``{"gsm8k": GSM8KReward(...)}``): per-sample
            :class:`~rlcore.interfaces.BaseReward` (scored in the pool) or batched
            :class:`~rlcore.interfaces.BaseBatchReward` (scored in the driver, once per call
            on the rows that select it; :mod:`rlcore.reward.batched`).
        sources: ``data_source -> reward names`` (``[reward.sources]``).
        default: the reward names for a ``data_source`` not in ``sources``.
        weights: a weight per reward name (default 1.0); a row's score is the weighted sum.
        timeout_s: per-sample time limit of one reward call.
        batch_timeout_s: time limit of one batched scorer's call (None: none); past it the
            call raises :class:`~rlcore.errors.RewardError` naming the scorer.
        every_row: reward names that score every row, whatever its ``data_source``, after the
            source's own (the reward model's scorer ``rm``); a source may then list none.
        rm_threshold: the reward model's verdict is ``score/rm > rm_threshold``; where a row
            also has a rule reward's ``acc``, ``reward/rm/disagree_rule`` counts how often the
            two differ (:func:`rlcore.reward.model.disagreement`).
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

    - ``token_level_scores`` (B, R) float32: the weighted sum of the row's scorers, each
      sequence-level score at the last valid response token, each token-level score
      (a batched scorer's (B, R)) on its own token (zero outside the response mask);
    - ``score`` (per row, combined; the sum of the row's ``token_level_scores``), ``acc``
      (the first of the row's rewards that gives one, else ``score > 0``), ``pred`` and any
      other extra a reward returns (None where a row's rewards gave none), and
      ``score/<name>`` per reward when there are several (unweighted; NaN where not used);
    - metrics ``reward/<data_source>/<extra>``: the mean of each numeric (or boolean) extra
      other than ``score``, ``acc`` and ``count`` over the source's rows that give it (the
      calculator's ``used_tool``, a length, a sub-score);
    - metrics ``reward/timeouts``, ``reward/errors``, ``reward/empty_responses`` (counts in
      this batch), ``reward/<data_source>/score``, ``.../acc`` (means), ``.../count``,
      ``reward/scorer/<name>/mean`` (each scorer's own, unweighted score over the rows it
      scored; ``scorer/`` keeps the names apart from a data source's or a reason's), a
      batched scorer's own metrics as ``reward/scorer/<name>/<key>``, and
      ``reward/reason/<reason>``: how many rows' extras have that string ``reason`` (the
      code reward's ``pass``, ``timeout``, ...; only reasons seen in the batch appear).
    """

    def __init__(
        self,
        tokenizer: Any,
        rewards: Mapping[str, BaseReward | BaseBatchReward],
        sources: Mapping[str, Sequence[str]] | None = None,
        default: Sequence[str] | str = (),
        weights: Mapping[str, float] | None = None,
        timeout_s: float = 5.0,
        num_workers: int = 0,
        pool_min_batch: int = 0,
        pool_min_seconds: float = 0.0,
        batch_timeout_s: float | None = None,
        every_row: Sequence[str] = (),
        rm_threshold: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.rewards = dict(rewards)
        for name, reward in self.rewards.items():
            if not isinstance(reward, BaseReward | BaseBatchReward):
                msg = (
                    f"reward {name!r} is a {type(reward).__name__}, not a "
                    "rlcore.interfaces.BaseReward or BaseBatchReward"
                )
                raise ConfigError(msg)
        # Per-sample rewards go to the pool; batched scorers stay here (models, clients).
        self.sample_rewards = {
            n: r for n, r in self.rewards.items() if isinstance(r, BaseReward)
        }  # fmt: skip
        self.batch_rewards = {
            n: r for n, r in self.rewards.items() if isinstance(r, BaseBatchReward)
        }  # fmt: skip
        self.sources = {ds: _names(v) for ds, v in (sources or {}).items()}
        self.default = _names(default)
        self.every_row = _names(every_row)
        self.rm_threshold = rm_threshold
        self.weights = dict(weights or {})
        for where, names in [("[reward] default", self.default), ("every_row", self.every_row)] + [
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
        try:
            REWARD_TIMEOUT.check("[reward] timeout_s", timeout_s)
            if batch_timeout_s is not None:
                BATCH_REWARD_TIMEOUT.check("[reward] batch_timeout_s", batch_timeout_s)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if num_workers < 0:
            msg = f"[reward] num_workers must be >= 0, got {num_workers}"
            raise ConfigError(msg)
        self.timeout_s = timeout_s
        self.batch_timeout_s = batch_timeout_s
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
        mask = _response_mask(data, R)  # (B, R) bool
        ends = _ends(mask)  # (B,) int64, 0 for an empty response
        sources = [str(s) for s in _column(data, "data_source")]
        truths = [_ground_truth(rm, i) for i, rm in enumerate(_column(data, "reward_model"))]
        extras_in = data.non_tensor_batch.get("extra_info")
        # A multi-turn rollout ([agent]) adds each conversation's turns and tool counts; the
        # reward sees them in extra_info (keys "turns", "tool_calls", "tool_errors", ...).
        agent_in = data.non_tensor_batch.get("agent")
        infos: list[dict[str, Any] | None] = []
        for i in range(B):
            extra = extras_in[i] if extras_in is not None else None
            extra = dict(extra) if isinstance(extra, Mapping) else None
            if agent_in is not None and isinstance(agent_in[i], Mapping):
                extra = {**(extra or {}), **agent_in[i]}
            infos.append(extra)

        lens: list[int] = ends.tolist()
        # numpy rows, not lists: transformers type-checks every int of a list (10x slower).
        ids_np = responses.detach().cpu().numpy()
        ids = [ids_np[i, :n] for i, n in enumerate(lens)]
        texts = _decode(self.tokenizer, ids)
        # Each non-empty row's rewards, in the order listed; an empty one scores 0 (no token).
        row_names: list[list[str]] = [
            self._names_for(sources[i]) if lens[i] else [] for i in range(B)
        ]

        # --- per-sample rewards: one task per (row, reward) ---------------------------------
        tasks: list[Task] = []
        owner: list[int] = []
        for i in range(B):
            for name in row_names[i]:
                if name in self.sample_rewards:
                    tasks.append((len(tasks), name, sources[i], texts[i], truths[i], infos[i]))
                    owner.append(i)
        outcomes = self._run(tasks)

        values = {name: np.full(B, np.nan) for name in self.rewards}  # unweighted, per row
        row_extras: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in self.rewards}
        timeouts = errors = 0
        first_problem = ""
        for task, i, (status, value, extra_out, message, _) in zip(tasks, owner, outcomes):
            name = task[1]
            if status != "ok":
                timeouts += status == "timeout"
                errors += status == "error"
                first_problem = first_problem or f"{message} (data_source {task[2]!r})"
            values[name][i] = value
            row_extras[name][i] = extra_out
        if first_problem:
            log.warning(
                "reward: %d timeouts, %d errors in %d calls; first: %s",
                timeouts, errors, len(tasks), first_problem,
            )  # fmt: skip

        # --- batched scorers: one call each, on the rows that select it -------------------
        token_parts: dict[str, torch.Tensor] = {}  # name -> (B, R) of a token-level scorer
        scorer_metrics: dict[str, float] = {}
        if self.batch_rewards:
            mask_f = torch.as_tensor(mask, dtype=torch.float32)
            prompt_texts = self._prompt_texts(data, lens)
        for name, scorer in self.batch_rewards.items():
            rows = [i for i in range(B) if name in row_names[i]]
            if not rows:
                continue
            batch = reward_batch(
                data,
                rows,
                prompts=prompt_texts,
                responses=texts,
                response_mask=mask_f,
                sources=sources,
                truths=truths,
                extra_infos=infos,
            )
            result = checked_scores(
                name, call_batched(name, scorer, batch, self.batch_timeout_s), batch
            )
            values[name][rows] = result.row_scores
            for k, i in enumerate(rows):
                row_extras[name][i] = result.extras[k]
            if result.token_scores is not None:
                part = torch.zeros(B, R, dtype=torch.float32)
                part[torch.as_tensor(rows, dtype=torch.long)] = result.token_scores
                token_parts[name] = part
            for key, value in result.metrics.items():
                scorer_metrics[f"reward/scorer/{name}/{key}"] = value

        # --- combine per row, by weight ---------------------------------------------------
        scores = np.zeros(B, dtype=np.float64)
        at_end = np.zeros(B, dtype=np.float64)  # the sequence-level part, on the last token
        extras: list[dict[str, Any]] = [{} for _ in range(B)]
        for i in range(B):
            for name in row_names[i]:
                w = self.weights.get(name, 1.0)
                scores[i] += w * values[name][i]
                if name not in token_parts:
                    at_end[i] += w * values[name][i]
                for key, v in row_extras[name].get(i, {}).items():
                    extras[i].setdefault(key, v)  # the first reward listed wins

        # A rule reward's own verdict per row, where one gave it (for the RM agreement).
        rule_acc = [e.get("acc") for e in extras]
        acc = np.array([bool(e.get("acc", s > 0)) for e, s in zip(extras, scores)])
        # Sequence-level scores at the last valid response token; (B, R). Rows without one
        # keep zeros. Token-level scores add on their own tokens.
        token_level_scores = torch.zeros(B, R, dtype=torch.float32)
        rows_np = np.flatnonzero(ends)
        token_level_scores[rows_np, ends[rows_np] - 1] = torch.as_tensor(
            at_end[rows_np], dtype=torch.float32
        )
        for name, part in token_parts.items():
            token_level_scores += self.weights.get(name, 1.0) * part

        non_tensors: dict[str, Any] = {
            "score": _objects(scores.tolist()),
            "acc": _objects(acc.tolist()),
        }
        for key in sorted({k for e in extras for k in e} - {"acc", "score"}):
            non_tensors[key] = _objects([e.get(key) for e in extras])
        if len(self.rewards) > 1:
            for name, arr in values.items():
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
        src = np.array(sources, dtype=object)
        for ds in sorted(set(sources)):
            sel = src == ds
            metrics[f"reward/{ds}/score"] = float(scores[sel].mean())
            metrics[f"reward/{ds}/acc"] = float(acc[sel].mean())
            metrics[f"reward/{ds}/count"] = float(sel.sum())
            metrics.update(extra_means(extras, sel, ds))
        for name, arr in values.items():  # each scorer's own score, over the rows it scored
            scored = arr[~np.isnan(arr)]
            if scored.size:
                metrics[f"reward/scorer/{name}/mean"] = float(scored.mean())
        for key, value in scorer_metrics.items():
            metrics.setdefault(key, value)
        if RM_SCORER in values:
            metrics |= disagreement(values[RM_SCORER], rule_acc, self.rm_threshold)
        out = DataProto.from_dict(
            tensors={"token_level_scores": token_level_scores}, non_tensors=non_tensors
        )
        return out, metrics

    def roles(self) -> list[GenerationRole]:
        """The generation roles the batched scorers declare (:attr:`BaseBatchReward.roles`),
        in scorer order; the trainer places them and calls :meth:`bind_roles`."""
        return [role for scorer in self.batch_rewards.values() for role in scorer.roles]

    def bind_roles(self, groups: Mapping[str, Any]) -> None:
        """Hand each batched scorer the worker groups of the roles it declared."""
        for name, scorer in self.batch_rewards.items():
            wanted = [role.name for role in scorer.roles]
            if not wanted:
                continue
            missing = [r for r in wanted if r not in groups]
            if missing:
                msg = f"reward {name!r}: its roles {missing} were not placed"
                raise ConfigError(msg)
            scorer.bind_roles({r: groups[r] for r in wanted})

    def close(self) -> None:
        """Stop the scoring processes, if any were started, and close the batched scorers."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for scorer in self.batch_rewards.values():
            scorer.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- scoring ----------------------------------------------------------------------------

    def _names_for(self, data_source: str) -> list[str]:
        names = self.sources.get(data_source, self.default)
        names = names + [n for n in self.every_row if n not in names]
        if not names:
            msg = (
                f"no reward for data_source {data_source!r}: add it to [reward.sources] "
                f"(known: {', '.join(sorted(self.sources)) or 'none'}) or set [reward] default"
            )
            raise ConfigError(msg)
        return names

    def _prompt_texts(self, data: DataProto, lens: list[int]) -> list[str]:
        """Each row's decoded prompt (its attended tokens), for the batched scorers; "" for an
        empty response's row, which no scorer sees."""
        prompts = data.batch.get("prompts")
        if prompts is None:
            msg = (
                "reward manager: a batched reward needs the 'prompts' tensor "
                f"(the batch has: {sorted(data.batch)})"
            )
            raise DataError(msg)
        ids_np = prompts.detach().cpu().numpy()
        if "attention_mask" in data.batch:
            attended = data.batch["attention_mask"][:, : ids_np.shape[1]].detach().cpu().numpy()
            keep = attended != 0
        else:
            keep = np.ones(ids_np.shape, dtype=bool)
        wanted = [i for i, n in enumerate(lens) if n]
        decoded = _decode(self.tokenizer, [ids_np[i][keep[i]] for i in wanted])
        texts = [""] * len(lens)
        for i, text in zip(wanted, decoded):
            texts[i] = text
        return texts

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
                self._pool = ScoringPool(self.sample_rewards, self.num_workers, self.timeout_s)
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
                out = [call_reward(self.sample_rewards, t, self.timeout_s) for t in tasks]
        else:
            if not self._warned_no_limit:
                log.warning(
                    "reward: scoring off the main thread without a pool (num_workers=1); "
                    "the %s s time limit cannot be enforced", self.timeout_s,
                )  # fmt: skip
                self._warned_no_limit = True
            out = [call_reward(self.sample_rewards, t, None) for t in tasks]
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


_NOT_EXTRA_METRICS = frozenset({"score", "acc", "count"})


def extra_means(
    extras: Sequence[Mapping[str, Any]], sel: Any, ds: str, prefix: str = "reward"
) -> dict[str, float]:
    """``<prefix>/<ds>/<key>``: the mean of every numeric or boolean extra over the selected
    rows that give a finite one (strings such as ``pred`` or ``reason`` are not averaged)."""
    sums: dict[str, list[float]] = {}
    for extra, chosen in zip(extras, sel):
        if not chosen:
            continue
        for key, value in extra.items():
            if key in _NOT_EXTRA_METRICS or not isinstance(value, int | float | np.number):
                continue
            number = float(value)
            if math.isfinite(number):
                sums.setdefault(key, []).append(number)
    return {f"{prefix}/{ds}/{key}": sum(vals) / len(vals) for key, vals in sorted(sums.items())}
