"""``judge``: a generative judge as a batched reward (``BaseBatchReward``).

The judge is a model served by a rollout engine (``rollout = "hf"``, or ``"vllm"`` where it
is installed) in a worker role of its own: the reward declares a
:class:`~rlcore.interfaces.GenerationRole` (``role``, default ``judge``), the core places it
beside the policy in every process of the run's pool and hands the role's worker group back
(:meth:`JudgeReward.bind_roles`). Its weights are never synced: it judges every step with the
model it started with.

Each step the reward manager gives the rows that select ``judge`` (one call per step). For
each row the ``template`` is filled with ``{prompt}`` (the last user message of the row's
``raw_prompt``, else the decoded prompt), ``{response}``
(the policy's answer; required) and ``{ground_truth}``; the prompts go to the role
``batch_size`` at a time (at most that many judged at once, split over the role's ranks),
each call bounded by ``timeout_s`` (past it the run stops with an error naming the role and
the limit). The judgement is read by :class:`~rlcore_judge.parse.ScoreParser` and mapped to
[0, 1] by ``scale``; an unparseable one scores ``unparseable_score`` and is counted.

Metrics (under ``reward/scorer/<name>/``, ``<name>`` being this reward's name, ``judge``):
``unparseable`` (count in the step, out-of-range ones included), ``unparseable_frac``,
``out_of_range``, ``truncated_prompts``, ``calls``, ``response_tokens_mean`` and
``generate_s`` (the slowest rank's generation time, summed over the step's calls); the
manager adds ``reward/scorer/judge/mean``. Per row the extras ``judge_parsed`` (bool) and
``judge_raw`` (the number read, NaN when none).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from rlcore.errors import ConfigError, RewardError
from rlcore.interfaces import (
    DTYPE_NAMES,
    BaseBatchReward,
    BatchScores,
    GenerationRole,
    SamplingParams,
    key,
    seconds,
)
from rlcore_judge.parse import (
    DEFAULT_PATTERN,
    DEFAULT_TEMPLATE,
    Judgement,
    ScoreParser,
    check_pattern,
    check_template,
    render,
)

if TYPE_CHECKING:
    from rlcore.interfaces import RewardBatch
    from rlcore.protocol import DataProto

log = logging.getLogger(__name__)

__all__ = ["JudgeReward"]

_v = attrs.validators


def _template(_: Any, __: Any, value: str) -> None:
    check_template(value)


def _pattern(_: Any, __: Any, value: str) -> None:
    check_pattern(value)


def _model_folder(_: Any, __: Any, value: str) -> None:
    # The folder's files are checked with the run's others, before Ray starts (preflight:
    # rlcore.preflight.roles.check_reward_roles); `rlcore config validate` checks the config.
    if not value:
        msg = "is required: a local Hugging Face model folder (the judge model)"
        raise ValueError(msg)


def _scale(_: Any, __: Any, value: tuple[float, float]) -> None:
    lo, hi = value
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        msg = f"must be [low, high], two finite numbers with low < high; got {list(value)}"
        raise ValueError(msg)


def _finite(_: Any, __: Any, value: float) -> None:
    if not math.isfinite(value):
        msg = f"must be a finite number, got {value}"
        raise ValueError(msg)


class JudgeReward(BaseBatchReward):
    """A generative judge: a judge model, served by a rollout engine in a worker role of its
    own, rates each response from a prompt template; the rating is parsed and mapped to
    [0, 1], an unparseable one counted (docs/writing-a-reward.md, "A generative judge")."""

    @attrs.frozen(kw_only=True)
    class Config(BaseBatchReward.Config):
        model_path: str = key(
            "",
            "The judge model: a local Hugging Face folder (required; checked before Ray starts).",
            validator=_model_folder,
        )
        template: str = key(
            DEFAULT_TEMPLATE,
            "The judge's prompt (str.format): {response} required, {prompt} and "
            "{ground_truth} optional; a literal brace is {{ or }}. Sent as one user turn "
            "of the judge's chat template.",
            validator=_template,
        )
        role: str = key(
            "judge",
            "The name of the judge's worker role (logs, errors).",
            validator=_v.matches_re(r"[a-z][a-z0-9_]*"),
        )
        rollout: str = key("hf", "The rollout plugin serving the judge (hf; vllm where installed).")
        rollout_options: dict[str, Any] = key(
            help="That rollout plugin's own options (as under [rollout]), checked "
            "when the run builds the reward.",
            factory=dict,
        )
        dtype: str | None = key(
            None,
            "The judge's dtype; unset: model.dtype.",
            validator=_v.optional(_v.in_(DTYPE_NAMES)),
        )
        apply_chat_template: bool = key(
            True, "Wrap each prompt in the judge's chat template (when it has one)."
        )
        max_prompt_length: int = key(
            1024,
            "Judge prompt tokens kept (the last ones; longer prompts are counted "
            "in truncated_prompts).",
            validator=_v.ge(1),
        )
        max_new_tokens: int = key(64, "Tokens one judgement may take.", validator=_v.ge(1))
        temperature: float = key(
            0.0, "Judge sampling temperature; 0: greedy (the default).", validator=_v.ge(0.0)
        )
        top_p: float = key(
            1.0,
            "Judge nucleus sampling (with temperature > 0).",
            validator=[_v.gt(0.0), _v.le(1.0)],
        )
        top_k: int = key(-1, "Judge top-k sampling; -1: off (with temperature > 0).")
        score_pattern: str = key(
            DEFAULT_PATTERN,
            "Regular expression whose last match holds the score (its capture "
            "group, else the whole match); default: a number in double brackets, [[7]].",
            validator=_pattern,
        )
        last_number: bool = key(
            False, "When score_pattern does not match, read the text's final number."
        )
        scale: tuple[float, float] = key(
            (0.0, 10.0),
            "[low, high] of the judge's scale; a score x maps to "
            "(x - low) / (high - low) in [0, 1].",
            validator=_scale,
        )
        out_of_range: Literal["unparseable", "clamp"] = key(
            "unparseable",
            "A number outside scale: unparseable (counted) or clamp.",
            validator=_v.in_(("unparseable", "clamp")),
        )
        unparseable_score: float = key(
            0.0,
            "The score of an unparseable judgement (counted in unparseable).",
            validator=_finite,
        )
        batch_size: int = key(
            64,
            "Judge prompts per call (the most judged at once, split over the "
            "role's ranks); calls run one after another.",
            validator=_v.ge(1),
        )
        timeout_s: float = key(
            300.0,
            "Wall-clock limit of one judge call (s); past it the run stops naming the role.",
            validator=seconds(holder="ray.wait"),
        )

    config: JudgeReward.Config

    def __init__(self, config: JudgeReward.Config | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.parser = ScoreParser(
            cfg.score_pattern,
            last_number=cfg.last_number,
            scale=cfg.scale,
            out_of_range=cfg.out_of_range,
            unparseable_score=cfg.unparseable_score,
        )
        self.sampling = SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=cfg.max_new_tokens,
            do_sample=cfg.temperature > 0,
        )
        self._rollout_options: Any = None
        self._group: Any = None
        self._warned = False

    # --- the role ---------------------------------------------------------------------------

    @property
    def roles(self) -> tuple[GenerationRole, ...]:
        cfg = self.config
        return (
            GenerationRole(
                name=cfg.role,
                model_path=cfg.model_path,
                rollout=cfg.rollout,
                rollout_options=self._options(),
                dtype=cfg.dtype,  # type: ignore[arg-type]  # checked against DTYPE_NAMES
                max_prompt_length=cfg.max_prompt_length,
                max_response_length=cfg.max_new_tokens,
                apply_chat_template=cfg.apply_chat_template,
            ),
        )

    def _options(self) -> Any:
        """The rollout plugin's ``Config`` from ``rollout_options`` (checked once)."""
        if self._rollout_options is None:
            from rlcore.config.convert import render_path, structure
            from rlcore.plugins import Component

            where = "reward.options.judge.rollout"
            cls = Component(kind="rollout", name=self.config.rollout, where=where).resolve()
            path = ("reward", "options", "judge", "rollout_options")
            options, problems = structure(dict(self.config.rollout_options), cls.Config, path)
            if problems:
                key, why = problems[0]
                msg = f"{render_path(key)}: {why}"
                raise ConfigError(msg)
            self._rollout_options = options
        return self._rollout_options

    def bind_roles(self, groups: Mapping[str, Any]) -> None:
        self._group = groups[self.config.role]

    # --- scoring ----------------------------------------------------------------------------

    def prompts(self, batch: RewardBatch) -> list[str]:
        """The judge's prompt for each row of ``batch``."""
        template = self.config.template
        return [
            render(template, prompt=p, response=r, ground_truth=t)
            for p, r, t in zip(questions(batch), batch.responses, batch.ground_truths)
        ]

    def score_batch(self, batch: RewardBatch) -> BatchScores:
        import torch

        if self._group is None:
            msg = f"judge: role {self.config.role!r} is not bound; the trainer places it"
            raise RewardError(msg)
        texts = self.prompts(batch)
        answers: list[str] = []
        truncated = calls = 0
        generate_s = tokens = 0.0
        size = self.config.batch_size
        for start in range(0, len(texts), size):
            out = self._call(texts[start : start + size])
            answers.extend(str(a) for a in out.non_tensor_batch["generated_text"])
            truncated += int(sum(bool(t) for t in out.non_tensor_batch["prompt_truncated"]))
            metrics = out.meta_info.get("metrics") or {}
            generate_s += _max(metrics.get(f"timing_s/worker/{self.config.role}_generate"))
            tokens += _sum(metrics.get(f"{self.config.role}/response_tokens"))
            calls += 1
        judged = [self.parser(a) for a in answers]
        unparseable = [j for j in judged if not j.parsed]
        if unparseable:
            self._log_unparseable(answers, judged, len(unparseable))
        n = max(len(judged), 1)
        return BatchScores(
            scores=torch.tensor([j.score for j in judged], dtype=torch.float32),
            extras={
                "judge_parsed": [j.parsed for j in judged],
                "judge_raw": [math.nan if j.raw is None else j.raw for j in judged],
            },
            metrics={
                "unparseable": float(len(unparseable)),
                "unparseable_frac": len(unparseable) / n,
                "out_of_range": float(sum(j.status == "out_of_range" for j in judged)),
                "truncated_prompts": float(truncated),
                "calls": float(calls),
                "response_tokens_mean": tokens / n,
                "generate_s": generate_s,
            },
        )

    def _call(self, texts: list[str]) -> DataProto:
        """One call of the role on ``texts``, bounded by ``timeout_s``."""
        import numpy as np
        import ray

        from rlcore.protocol import DataProto

        column = np.empty(len(texts), dtype=object)
        column[:] = texts
        future = self._group.generate_text(
            DataProto.from_dict(non_tensors={"prompt_text": column}), self.sampling
        )
        limit = self.config.timeout_s
        ready, _ = ray.wait(list(future.refs), num_returns=len(future.refs), timeout=limit)
        if len(ready) < len(future.refs):  # the run stops; its end kills the workers
            msg = (
                f"judge role {self.config.role!r} did not answer {len(texts)} prompts within "
                f"reward.options.judge.timeout_s = {limit:g} s; raise it, lower batch_size or "
                "max_new_tokens"
            )
            raise RewardError(msg)
        result: DataProto = future.get()
        return result

    def _log_unparseable(self, answers: list[str], judged: list[Judgement], count: int) -> None:
        first = next(a for a, j in zip(answers, judged) if not j.parsed)
        level = logging.INFO if self._warned else logging.WARNING
        self._warned = True
        log.log(
            level,
            "judge: %d of %d judgements unparseable (scored %g); first: %r",
            count,
            len(judged),
            self.config.unparseable_score,
            first[:200],
        )


def questions(batch: RewardBatch) -> list[str]:
    """Each row's ``{prompt}``: the content of the last user message of the row's
    ``raw_prompt`` (the data's messages, without the policy's chat-template text), else the
    decoded prompt."""
    raw = batch.data.non_tensor_batch.get("raw_prompt")
    out: list[str] = []
    for i, decoded in enumerate(batch.prompts):
        text = decoded
        messages = raw[i] if raw is not None and i < len(raw) else None
        if hasattr(messages, "tolist"):
            messages = messages.tolist()
        if isinstance(messages, str):
            text = messages
        elif isinstance(messages, list):
            users = [
                m.get("content")
                for m in messages
                if isinstance(m, Mapping) and m.get("role") == "user"
            ]
            if users and isinstance(users[-1], str):
                text = users[-1]
        out.append(text)
    return out


def _max(values: Any) -> float:
    if values is None:
        return 0.0
    if isinstance(values, list | tuple):
        return float(max(values, default=0.0))
    return float(values)


def _sum(values: Any) -> float:
    if values is None:
        return 0.0
    if isinstance(values, list | tuple):
        return float(sum(values))
    return float(values)
