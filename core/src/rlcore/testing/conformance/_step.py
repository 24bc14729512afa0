"""``check_step_program``: an algorithm's step program against the three rules of a step.

The program (:meth:`BaseAlgorithm.step_program`, None: the default) runs on the driver
against in-process role groups: the program is under test, not the engines, so the groups
compute small deterministic functions of their input (responses drawn from a generator seeded
by the step and the prompt, log-probs from the token ids) and record what the updates got.
The rules, each failing with its name:

- ``step-updates-actor``: every step calls ``update_actor`` exactly once (and
  ``update_critic`` once when the algorithm needs a critic);
- ``step-keeps-rows``: the actor trains on ``batch_size × n`` rows, ``n`` per prompt ``uid``
  (a filter that drops groups must generate more until the batch is full); a program that
  says it trains a subset (:attr:`StepProgram.trains_subset`: best-of-n, pairs) trains at
  least one row, at most ``n`` per prompt of this step, and no row without weight (no valid
  token, or advantages all zero on its valid tokens): the rows it drops never reach the update;
- ``step-resumable``: a run that is stopped after a step and resumed from the saved state
  (the algorithm's and the program's ``state_dict``, the prompt loader's position and the
  RNG, what a checkpoint holds) trains on exactly the rows and tensors of the uninterrupted
  run's next step: nothing the program carries from step to step lives outside its state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rlcore.interfaces import BaseAlgorithm, SamplingParams
from rlcore.rl.step import StepContext, StepProgram
from rlcore.testing.conformance._common import fail, name_of

if TYPE_CHECKING:
    import torch

    from rlcore.protocol import DataProto

__all__ = ["STEP_RULES", "check_step_program"]

#: The rules :func:`check_step_program` checks, by name.
STEP_RULES = ("step-updates-actor", "step-keeps-rows", "step-resumable")

_PROMPT_LEN, _RESPONSE_LEN, _VOCAB = 4, 6, 11
_POLICY_KEYS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")


class _Prompts:
    """A prompt loader: batch ``i`` is rows ``i*b .. i*b+b-1`` of an endless prompt stream."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.position = 0

    def next(self) -> DataProto:
        import numpy as np
        import torch

        from rlcore.protocol import DataProto

        rows = range(self.position * self.batch_size, (self.position + 1) * self.batch_size)
        self.position += 1
        ids = torch.tensor([[(r * 7 + j) % _VOCAB + 1 for j in range(_PROMPT_LEN)] for r in rows])
        mask = torch.ones_like(ids)
        return DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": mask,
                "position_ids": torch.arange(_PROMPT_LEN).expand_as(ids).clone(),
            },
            non_tensors={"uid": np.array([f"p{r}" for r in rows], dtype=object)},
        )

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


def _log_probs(batch: DataProto, salt: int) -> torch.Tensor:
    # A deterministic stand-in for a model's log-probs: a function of the token ids only.
    import torch

    ids = batch.batch["responses"].to(torch.float32)
    return -torch.log1p((ids * (salt + 3)) % 5 + 1) * batch.batch["response_mask"]


class _Group:
    """The role worker groups' methods, in process; records every update's input."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.updates: list[DataProto] = []

    def _out(self, key: str, value: torch.Tensor) -> DataProto:
        from rlcore.protocol import DataProto

        return DataProto.from_dict(tensors={key: value}, meta_info={"metrics": {}})

    def generate_sequences(self, prompts: DataProto, sampling: SamplingParams) -> DataProto:
        import torch

        from rlcore.protocol import DataProto

        ids = prompts.batch["input_ids"]
        rows: list[torch.Tensor] = []
        for row in ids.tolist():
            # Seeded by the prompt and the row's place in this call: the same rows in the same
            # order give the same responses, after a resume too.
            gen = torch.Generator().manual_seed(hash(tuple(row)) % (2**31) + len(rows))
            rows.append(torch.randint(1, _VOCAB, (_RESPONSE_LEN,), generator=gen))
        responses = torch.stack(rows)
        lengths = (responses.sum(-1) % _RESPONSE_LEN) + 1  # 1 .. R valid tokens
        response_mask = (torch.arange(_RESPONSE_LEN) < lengths[:, None]).long()
        return DataProto.from_dict(
            tensors={
                "input_ids": torch.cat([ids, responses], -1),
                "attention_mask": torch.cat([prompts.batch["attention_mask"], response_mask], -1),
                "position_ids": torch.arange(ids.shape[1] + _RESPONSE_LEN).expand(len(ids), -1),
                "responses": responses,
                "response_mask": response_mask,
            },
            meta_info={"metrics": {"timing_s/worker/generate": [0.0]}},
        )

    def compute_log_prob(self, data: DataProto) -> DataProto:
        key = f"{self.prefix}_log_prob" if self.prefix else "old_log_probs"
        return self._out(key, _log_probs(data, len(self.prefix)))

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        return self._out("ref_log_prob", _log_probs(data, 1))

    def compute_values(self, data: DataProto) -> DataProto:
        return self._out("values", _log_probs(data, 2))

    def update_actor(self, data: DataProto, step: int) -> DataProto:
        from rlcore.protocol import DataProto

        self.updates.append(data)
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.0]}})

    update_critic = update_actor


def _reward(batch: DataProto) -> tuple[DataProto, dict[str, float]]:
    """A rule reward: 1 when a response's valid tokens sum to an even number."""
    import numpy as np
    import torch

    from rlcore.protocol import DataProto

    b = batch.batch
    mask = b["response_mask"]
    score = (((b["responses"] * mask).sum(-1) % 2) == 0).to(torch.float32)
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    scores[torch.arange(len(scores)), mask.sum(-1) - 1] = score  # on the last valid token
    per_row = np.asarray(score.tolist(), dtype=object)  # as the reward manager reports them
    out = DataProto.from_dict(
        tensors={"token_level_scores": scores}, non_tensors={"score": per_row, "acc": per_row}
    )
    return out, {"reward/mean": float(score.mean())}


class _Context(StepContext):
    """The step context over the in-process groups: no mesh, rows as they are."""

    def model_input(self, batch: DataProto) -> DataProto:
        self.model_in = batch.select(batch_keys=list(_POLICY_KEYS), non_tensor_batch_keys=[])
        return self.model_in

    def rollout_mismatch(self, batch: DataProto) -> None:
        return None

    def actor_input(self, batch: DataProto, *, keep_groups: bool = False) -> DataProto:
        # The rows with every tensor and the uid: the rules read the groups and the values.
        return batch.select(non_tensor_batch_keys=["uid"])

    def critic_input(self, batch: DataProto) -> DataProto:
        return batch.select(non_tensor_batch_keys=["uid"])


class _Run:
    """One run of a program: its state objects, and the step loop."""

    def __init__(self, make_algorithm: Callable[[], BaseAlgorithm], batch_size: int, n: int):
        self.algorithm = make_algorithm()
        self.program: StepProgram = self.algorithm.step_program() or StepProgram()
        self.prompts = _Prompts(batch_size)
        self.policy, self.critic = _Group(), _Group()
        self.roles = {r.name: _Group(r.name) for r in self.algorithm.needs.extra_roles}
        self.n = n

    def step(self, step: int) -> StepContext:
        needs = self.algorithm.needs
        ctx = _Context(
            policy=self.policy,
            critic=self.critic if needs.critic else None,
            roles=self.roles,
            algorithm=self.algorithm,
            reward_manager=_reward,
            step=step,
            next_prompts=self.prompts.next,
            n=self.n,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=_RESPONSE_LEN),
            reference=needs.reference,
        )
        self.program.run(ctx, self.prompts.next())
        return ctx

    def state(self) -> dict[str, Any]:
        from rlcore.checkpoint import capture_rng_state

        # What a checkpoint holds, as JSON would carry it (a deep copy: nothing shared).
        return copy.deepcopy(
            {
                "algorithm": self.algorithm.state_dict(),
                "program": self.program.state_dict(),
                "dataloader": self.prompts.state_dict(),
                "rng": capture_rng_state(),
            }
        )

    def restore(self, state: dict[str, Any]) -> None:
        from rlcore.checkpoint import restore_rng_state

        if state["algorithm"]:
            self.algorithm.load_state_dict(copy.deepcopy(state["algorithm"]))
        if state["program"]:
            self.program.load_state_dict(copy.deepcopy(state["program"]))
        self.prompts.load_state_dict(state["dataloader"])
        restore_rng_state(state["rng"])


def _same(a: DataProto, b: DataProto) -> str | None:
    """None when two update inputs hold the same rows and tensors, else what differs."""
    import torch

    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    if list(a.non_tensor_batch["uid"]) != list(b.non_tensor_batch["uid"]):
        return "other prompts (uids)"
    for key in sorted(set(a.batch) | set(b.batch)):
        if key not in a.batch or key not in b.batch:
            return f"{key!r} only in one of them"
        if not torch.equal(a.batch[key], b.batch[key]):
            return f"{key!r} differs"
    return None


def check_step_program(
    make_algorithm: Callable[[], BaseAlgorithm],
    *,
    batch_size: int = 4,
    n: int = 2,
    steps: int = 3,
    what: str | None = None,
) -> None:
    """Run the algorithm's step program for ``steps`` steps and check the three rules.

    ``make_algorithm``: builds a fresh algorithm (e.g. ``lambda: MyAlgorithm(config)``); the
    resume rule builds a second one, as a resumed run does. Fails with an
    :class:`AssertionError` ``<algorithm>: <rule>: <what was seen>`` (rules:
    :data:`STEP_RULES`).
    """
    if steps < 2:
        msg = "check_step_program: steps must be >= 2 (the resume rule resumes after step 1)"
        raise ValueError(msg)
    probe = make_algorithm()
    what = what or name_of(type(probe))
    needs_critic = probe.needs.critic
    # --- an uninterrupted run ------------------------------------------------------------------
    whole = _Run(make_algorithm, batch_size, n)
    saved: dict[str, Any] | None = None
    for step in range(steps):
        if step == 1:
            saved = whole.state()
        first = whole.prompts.position
        ctx = whole.step(step)
        _check_updates(what, ctx, needs_critic, step)
        rows = whole.policy.updates[-1]
        if whole.program.trains_subset:
            drawn = range(first * batch_size, whole.prompts.position * batch_size)
            _check_subset(what, rows, {f"p{r}" for r in drawn}, n, step)
        else:
            _check_rows(what, rows, batch_size, n, step)
    # --- stopped after step 1, resumed in a fresh process (fresh program and algorithm) ------
    assert saved is not None
    resumed = _Run(make_algorithm, batch_size, n)
    resumed.restore(saved)
    for step in range(1, steps):
        resumed.step(step)
        diff = _same(resumed.policy.updates[-1], whole.policy.updates[step])
        if diff is not None:
            fail(
                what,
                "step-resumable",
                f"step {step} after a resume from step 1's state trains on other data than the "
                f"uninterrupted run ({diff}); keep what the program carries between steps in "
                "its state_dict()",
            )


def _check_updates(what: str, ctx: StepContext, needs_critic: bool, step: int) -> None:
    actor = ctx.phases.count("update_actor")
    if actor != 1:
        fail(
            what,
            "step-updates-actor",
            f"step {step} called update_actor {actor} times (phases: {ctx.phases}); "
            "call ctx.update_actor(batch) once per step",
        )
    critic = ctx.phases.count("update_critic")
    if needs_critic and critic != 1:
        fail(
            what,
            "step-updates-actor",
            f"step {step} called update_critic {critic} times with needs.critic (phases: "
            f"{ctx.phases}); call ctx.update_critic(batch) once per step",
        )


def _check_rows(what: str, rows: DataProto, batch_size: int, n: int, step: int) -> None:
    want = batch_size * n
    uids: Sequence[Any] = list(rows.non_tensor_batch["uid"])
    counts: dict[Any, int] = {}
    for uid in uids:
        counts[uid] = counts.get(uid, 0) + 1
    partial = sorted(str(u) for u, c in counts.items() if c != n)
    if len(rows) != want or partial:
        fail(
            what,
            "step-keeps-rows",
            f"step {step}: the actor trained on {len(rows)} rows, {len(counts)} prompts "
            f"(want {want} = {batch_size} prompts x n={n}; groups not of n rows: {partial[:4]})",
        )


def _check_subset(what: str, rows: DataProto, uids: set[str], n: int, step: int) -> None:
    import torch

    counts: dict[Any, int] = {}
    for uid in rows.non_tensor_batch["uid"]:
        counts[uid] = counts.get(uid, 0) + 1
    foreign = sorted(str(u) for u in counts if u not in uids)
    over = sorted(str(u) for u, c in counts.items() if c > n)
    mask = rows.batch["response_mask"].to(torch.bool)
    weighted = ((rows.batch["advantages"] != 0) & mask).any(-1)
    zero = int((~weighted).sum())
    if len(rows) == 0 or foreign or over or zero:
        fail(
            what,
            "step-keeps-rows",
            f"step {step}: a subset-training program trained {len(rows)} rows (want >= 1), "
            f"{zero} of them without weight (no valid token or all-zero advantages; leave them "
            f"out), prompts not of this step: {foreign[:4]}, prompts with more than n={n} "
            f"rows: {over[:4]}",
        )
