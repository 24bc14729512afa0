"""The training step as a program of named phases: the design's for-loop body, one line each.

:class:`StepProgram` is the default step of GRPO, PPO, RLOO (and every algorithm whose
:meth:`~rlcore.interfaces.BaseAlgorithm.step_program` returns None). Its body reads like the
design's pseudo-code because :meth:`StepContext.phase` does the plumbing of each line: it
times the call (``timing_s/<name>``), takes the metrics a worker reported (or the
``(value, metrics)`` pair a driver-side call returned) and returns the data::

    batch |= ctx.phase("ref", ctx.policy.compute_ref_log_prob, model_in)

An algorithm changes the dataflow in one of two ways, from public blocks only (the role
worker groups, the reward manager, the layout helpers and the phase helper of
:class:`StepContext`):

- insert phases into the default program: ``StepProgram(after_generate=(my_filter,),
  after_log_probs=(my_teacher,), before_update=(my_extra_loss_inputs,))``; each is a
  :data:`Phase`, ``(ctx, batch) -> batch``;
- or subclass :class:`StepProgram` and write :meth:`StepProgram.run` itself.

Rules a program keeps (checked by
:func:`rlcore.testing.conformance.check_step_program`): it updates the actor once per step,
the batch it trains on holds ``train_batch_size × n`` rows (or, with
:attr:`StepProgram.trains_subset`, only rows of this step that carry weight), and everything
it carries from one step to the next is in its :meth:`StepProgram.state_dict` (checkpointed
with the run).
``docs/writing-an-algorithm.md`` walks through it.

Nothing heavy is imported here: torch loads with the batch's tensors.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlcore.tracking.metrics import timed
from rlcore.tracking.reductions import combine_calls, reduce_metrics, reduction_of

if TYPE_CHECKING:
    from rlcore.interfaces import BaseAlgorithm, SamplingParams
    from rlcore.protocol import DataProto

__all__ = [
    "AGENT_ROW_KEY",
    "PROMPT_KEYS",
    "Phase",
    "RewardFn",
    "StepContext",
    "StepProgram",
    "compute_advantages",
    "expand_prompts",
    "join_generated",
]

# The rollout's inputs, taken out of the (already expanded) prompt batch.
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
# The row of the prompt batch each generated row came from, when a harness split one row's
# trajectory into several samples (rlcore.agent.harness); absent: one row per prompt row.
AGENT_ROW_KEY = "agent_row"
# The row's task, sent along (not popped) for an [agent] harness (rlcore.agent.harness).
TASK_KEYS = ("raw_prompt", "reward_model", "data_source", "extra_info")


def expand_prompts(batch: DataProto, n: int) -> DataProto:
    """``n`` rows per prompt, each prompt's rows side by side (verl's ``repeat(n,
    interleave=True)``): a group's statistics and shared-prompt engines rely on adjacency.
    The one expansion of a batch of prompts: the step, validation and the async queue."""
    return batch.repeat(n, interleave=True)


#: The reward manager's call: token-level scores (and per-sample ``score``/``acc``), metrics.
RewardFn = Callable[["DataProto"], tuple["DataProto", dict[str, float]]]

#: A phase inserted into the default program: takes the step's context and batch, returns
#: the batch (it may drop rows and generate more through ``ctx.next_prompts``).
Phase = Callable[["StepContext", "DataProto"], "DataProto"]


class StepContext(abc.ABC):
    """What one step's program works with, and what it gathers (timing, metrics).

    Blocks: ``policy`` and ``critic`` (the role worker groups: ``generate_sequences``,
    ``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``; ``compute_values``,
    ``update_critic``; ``critic`` is None without one), ``roles`` (the algorithm's extra
    roles by name, :attr:`BaseAlgorithm.extra_roles`), ``algorithm`` (the driver's copy),
    ``reward_model`` (the reward-model role, ``compute_rm_score``; None without
    ``[reward_model]``), ``reward_manager`` (``batch -> (scores, metrics)``; :meth:`reward`
    runs both), ``step`` (completed training steps,
    seeds the mini-batch shuffle), ``next_prompts`` (the next batch of prompts from the run's
    loader, for programs that generate more than one batch per step), and what the run
    decided: ``n`` (samples per prompt), ``sampling`` (training sampling), ``old_log_prob_pass``
    (False: the on-policy update's forward has them), ``reference`` (the algorithm needs
    ``ref_log_prob``). The trainer builds it (``rlcore.trainer.fit``); the layout blocks
    (:meth:`model_input`, :meth:`actor_input`, :meth:`critic_input`, :meth:`rollout_mismatch`)
    are its.
    """

    def __init__(
        self,
        *,
        policy: Any,
        critic: Any | None,
        algorithm: BaseAlgorithm,
        reward_manager: RewardFn,
        step: int,
        next_prompts: Callable[[], DataProto],
        n: int,
        sampling: SamplingParams,
        old_log_prob_pass: bool = True,
        reference: bool = False,
        roles: Mapping[str, Any] | None = None,
        world_size: int = 1,
        reward_model: Any | None = None,
    ) -> None:
        self.policy = policy
        self.critic = critic
        self.reward_model = reward_model
        self.roles: Mapping[str, Any] = roles or {}
        self.algorithm = algorithm
        self.reward_manager = reward_manager
        self.step = step
        self.next_prompts = next_prompts
        self.n = n
        self.sampling = sampling
        self.old_log_prob_pass = old_log_prob_pass
        self.reference = reference
        self.world_size = world_size
        self.timing: dict[str, float] = {}  # seconds per phase name (driver wall clock)
        self.worker_metrics: dict[str, float] = {}  # what workers reported, reduced
        self.metrics: dict[str, float] = {}  # what driver-side phases returned
        self.phases: list[str] = []  # names of the phases run, in order (conformance reads it)
        # Per phase name, each call's (seconds, metrics): a repeated phase logs its rounds.
        self._rounds: dict[str, list[tuple[float, dict[str, float]]]] = {}
        self.model_in: DataProto | None = None  # the policy's last input (the divergence guard)

    # --- the phase helper -------------------------------------------------------------------

    def phase(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as phase ``name``: timed, its metrics taken, data returned.

        A :class:`~rlcore.protocol.DataProto` result gives up ``meta_info["metrics"]`` (a
        worker's lists, reduced by :mod:`rlcore.tracking.reductions`); a ``(value, metrics)``
        pair gives up the dict. Either way the data comes back, so the line reads
        ``batch |= ctx.phase(...)``.

        A phase run again in the same step (a resampling round: DAPO, best-of-n) is a round:
        each round's values are also logged as ``<metric>/round_<r>`` (``r`` from 1, times
        as ``timing_s/<name>/round_<r>``), and the plain name holds all rounds: summed for
        times and metrics declared ``calls="sum"``, else the mean over the rounds.
        """
        from rlcore.protocol import DataProto

        self.phases.append(name)
        before = self.timing.get(name, 0.0)
        with timed(name, self.timing):
            out = fn(*args, **kwargs)
        seconds = self.timing[name] - before
        if isinstance(out, DataProto):
            reported = reduce_metrics(out.meta_info.pop("metrics", None) or {})
            self._take(name, seconds, reported, self.worker_metrics)
            return out
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
            self._take(name, seconds, dict(out[1]), self.metrics)
            return out[0]
        self._take(name, seconds, {}, self.metrics)
        return out

    def _take(
        self, name: str, seconds: float, reported: dict[str, float], into: dict[str, float]
    ) -> None:
        """One call's metrics into the step's; per round when phase ``name`` repeats."""
        rounds = self._rounds.setdefault(name, [])
        rounds.append((seconds, reported))
        if len(rounds) == 1:
            if into is self.metrics:
                into.update(reported)
            else:
                combine_calls(into, reported)
            return
        # A repeat: both rounds' own values, then the plain names over all rounds.
        for r, (took, values) in enumerate(rounds, start=1):
            self.metrics[f"timing_s/{name}/round_{r}"] = took
            for key, value in values.items():
                self.metrics[f"{key}/round_{r}"] = value
        for key, value in reported.items():
            if reduction_of(key).calls == "sum":
                into[key] = into.get(key, 0.0) + value
            else:
                seen = [values[key] for _, values in rounds if key in values]
                into[key] = sum(seen) / len(seen)

    # --- blocks the default program uses, public for the others -------------------------------

    @staticmethod
    def prompts(batch: DataProto) -> DataProto:
        """Pop the rollout's inputs (``input_ids``, masks, positions) out of ``batch``, with
        a copy of each row's task (:data:`TASK_KEYS`) for a harness."""
        prompts = batch.pop(batch_keys=list(PROMPT_KEYS))
        nt = batch.non_tensor_batch
        prompts.non_tensor_batch.update({k: nt[k] for k in TASK_KEYS if k in nt})
        return prompts

    def generate(self, batch: DataProto, name: str = "gen") -> DataProto:
        """Phase ``name``: one response per row of ``batch`` (already expanded), joined to it."""
        gen = self.phase(name, self.policy.generate_sequences, self.prompts(batch), self.sampling)
        return join_generated(batch, gen)

    @abc.abstractmethod
    def rollout_mismatch(self, batch: DataProto) -> None:
        """Add ``rollout/logprob_diff_*`` (the engine's old log-probs against the rollout's
        own) to the metrics, when the batch holds both."""

    @abc.abstractmethod
    def model_input(self, batch: DataProto) -> DataProto:
        """The tensors a forward pass over (prompt, response) needs; kept as ``model_in``."""

    @abc.abstractmethod
    def actor_input(self, batch: DataProto, *, keep_groups: bool = False) -> DataProto:
        """The actor update's rows: its loss inputs, laid out in whole mini-batches per rank
        (``needs.loss_keys`` included); ``keep_groups``: see :meth:`update_actor`."""

    @abc.abstractmethod
    def critic_input(self, batch: DataProto) -> DataProto:
        """The critic update's rows (values, returns), laid out like the actor's."""

    def log_probs_and_values(self, batch: DataProto) -> DataProto:
        """The forward passes over the generated batch, each a phase, joined to it: the old
        log-probs (``old_log_prob``, when the run keeps that pass), the reference's
        (``ref``, when the algorithm needs them) and the critic's values (``values``, with a
        critic). The forward input is kept as :attr:`model_in` (an extra role reads it)."""
        policy, critic = self.policy, self.critic
        model_in = self.model_input(batch)
        if self.old_log_prob_pass:  # else on-policy: the update's forward has them
            batch |= self.phase("old_log_prob", policy.compute_log_prob, model_in)
            self.rollout_mismatch(batch)
        if self.reference:  # the algorithm's needs.reference decided it
            batch |= self.phase("ref", policy.compute_ref_log_prob, model_in)
        if critic is not None:
            batch |= self.phase("values", critic.compute_values, model_in)
        return batch

    @staticmethod
    def rm_input(batch: DataProto) -> DataProto:
        """What the reward model is sent: the sequences' tensors and, for its own chat
        template, each row's ``raw_prompt`` (:func:`rlcore.reward.model.rm_inputs`)."""
        from rlcore.reward.model import RM_INPUT_KEYS

        keep = [k for k in ("raw_prompt",) if k in batch.non_tensor_batch]
        return batch.select(batch_keys=list(RM_INPUT_KEYS), non_tensor_batch_keys=keep)

    def reward(
        self, batch: DataProto, name: str = "reward", manager: RewardFn | None = None
    ) -> DataProto:
        """Phases ``rm`` (with a reward model: ``rm_scores``, verl's ``compute_rm_score``)
        and ``name`` (the reward manager, or ``manager``): the batch with its scores."""
        if self.reward_model is not None:
            rm = "rm" if name == "reward" else f"rm_{name.removeprefix('reward_')}"
            batch |= self.phase(rm, self.reward_model.compute_rm_score, self.rm_input(batch))
        batch |= self.phase(name, manager or self.reward_manager, batch)
        return batch

    def update_actor(self, batch: DataProto, *, keep_groups: bool = False) -> None:
        """Phase ``update_actor``: the policy's optimizer steps on ``batch``.

        ``batch`` is any rows of the step (all ``train_batch_size x n``, or the subset a
        program keeps, each with its weight in ``advantages``): they split into the
        configured number of mini-batches, and the loss of each divides by that
        mini-batch's own totals (its kept rows' tokens, for ``token-mean``).
        ``keep_groups``: the rows of one group (same ``uid``) stay in one mini-batch, on one
        rank and in one micro-batch, adjacent, numbered by the ``group_index`` tensor the
        loss sees (a pairwise loss); the update then does not shuffle.
        """
        rows = self.actor_input(batch, keep_groups=keep_groups)
        self.phase("update_actor", self.policy.update_actor, rows, self.step)

    def update_critic(self, batch: DataProto) -> None:
        """Phase ``update_critic``: the critic's optimizer steps on ``batch``."""
        if self.critic is None:
            msg = "update_critic: this run has no critic"
            raise RuntimeError(msg)
        self.phase("update_critic", self.critic.update_critic, self.critic_input(batch), self.step)


def compute_advantages(
    algorithm: BaseAlgorithm, batch: DataProto
) -> tuple[DataProto, dict[str, float]]:
    """The algorithm's rewards (e.g. minus a KL penalty), then its advantages; with metrics."""
    batch, metrics = algorithm.compute_rewards(batch)
    return algorithm.compute_advantages(batch), metrics


class StepProgram:
    """The default step (GRPO, PPO, RLOO), with optional inserted phases.

    ``after_generate``: phases run right after generation (filter, resample);
    ``after_log_probs``: after the forward passes (old log-probs, reference, values), before
    the reward and advantages (another model's log-probs the advantages read: a teacher);
    ``before_update``: after the advantages, before the updates (extra loss inputs). The
    program holds no run state; a subclass that does returns it from :meth:`state_dict`.
    """

    #: True for a program that hands the update a subset of the rows it generated (best-of-n,
    #: rejection sampling, pairs): the conformance rule ``step-keeps-rows`` then checks that
    #: every trained row is one of this step's and carries weight, not that all are there.
    trains_subset: bool = False

    def __init__(
        self,
        *,
        after_generate: Sequence[Phase] = (),
        after_log_probs: Sequence[Phase] = (),
        before_update: Sequence[Phase] = (),
    ) -> None:
        self.after_generate = tuple(after_generate)
        self.after_log_probs = tuple(after_log_probs)
        self.before_update = tuple(before_update)

    def run(self, ctx: StepContext, batch: DataProto) -> DataProto:
        """One step on a batch of prompts; returns the batch the update trained on."""
        critic = ctx.critic
        # --- n rows per prompt (here, once), one response per row ----------------------------
        batch = ctx.generate(expand_prompts(batch, ctx.n))
        for insert in self.after_generate:
            batch = insert(ctx, batch)
        # --- old log-probs, reference log-probs, values ---------------------------------------
        batch = ctx.log_probs_and_values(batch)
        for insert in self.after_log_probs:
            batch = insert(ctx, batch)
        # --- reward (the reward model's phase "rm", then the manager) and advantages ----------
        batch = ctx.reward(batch)
        batch = ctx.phase("adv", compute_advantages, ctx.algorithm, batch)
        for insert in self.before_update:
            batch = insert(ctx, batch)
        # --- updates ----------------------------------------------------------------------------
        if critic is not None:
            ctx.update_critic(batch)
        ctx.update_actor(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """What the program carries from step to step (checkpointed); the default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


def join_generated(batch: DataProto, gen: DataProto) -> DataProto:
    """``batch.union(gen)``, after repeating ``batch``'s rows to match when ``gen`` holds more
    rows than it (a harness's split trajectories, :data:`AGENT_ROW_KEY` naming each row's
    source), so every sample keeps its prompt's ``uid``, data and ground truth."""
    rows = gen.non_tensor_batch.get(AGENT_ROW_KEY)
    if rows is None or len(gen) == len(batch):
        return batch.union(gen)
    import numpy as np

    return batch.select_idxs(np.asarray(rows, dtype=np.int64)).union(gen)
