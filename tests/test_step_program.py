"""The step as a program of phases: the default program, inserted phases, the phase helper,
declared metric reductions, the loop plan, and ``check_step_program``'s three rules, each
caught by name on a deliberately broken program."""

from __future__ import annotations

import random

import pytest

from rlcore.interfaces import AlgorithmNeeds, ExtraRole


def _grpo(**options):
    from rlcore_grpo.algorithm import GRPO

    return GRPO(GRPO.Config(**options))


def _algorithm_with(program_factory, base=None):
    """A GRPO algorithm whose step_program() is ``program_factory()``."""
    from rlcore_grpo.algorithm import GRPO

    class WithProgram(base or GRPO):
        def step_program(self):
            return program_factory()

    return WithProgram()


# --- the default program and the rules it keeps ----------------------------------------------


def test_default_grpo_and_ppo_programs_pass_the_three_rules():
    from rlcore.testing.conformance import check_step_program
    from rlcore_ppo.algorithm import PPO

    check_step_program(_grpo)
    check_step_program(lambda: _grpo(use_kl_loss=True))  # with the reference phase
    check_step_program(PPO)  # with values and the critic update


def test_inserted_phases_run_where_declared_and_see_the_batch():
    from rlcore.rl.step import StepProgram
    from rlcore.testing.conformance import check_step_program
    from rlcore.testing.conformance._step import _Run

    seen: list[tuple[str, tuple[str, ...]]] = []

    def after_generate(ctx, batch):
        seen.append(("after_generate", tuple(sorted(batch.batch))))
        return batch

    def before_update(ctx, batch):
        seen.append(("before_update", tuple(sorted(batch.batch))))
        return batch

    def make():
        return _algorithm_with(
            lambda: StepProgram(after_generate=(after_generate,), before_update=(before_update,))
        )

    run = _Run(make, batch_size=2, n=2)
    ctx = run.step(0)
    assert ctx.phases == ["gen", "old_log_prob", "reward", "adv", "update_actor"]
    assert [where for where, _ in seen] == ["after_generate", "before_update"]
    assert "responses" in seen[0][1]
    assert "old_log_probs" not in seen[0][1]
    assert "advantages" in seen[1][1]
    check_step_program(make)


# --- the three rules, each on a program that breaks it -----------------------------------------


class _ForgetsTheUpdate:
    def run(self, ctx, batch):
        from rlcore.rl.step import compute_advantages

        batch = ctx.generate(batch.repeat(ctx.n, interleave=True))
        batch |= ctx.phase("old_log_prob", ctx.policy.compute_log_prob, ctx.model_input(batch))
        batch |= ctx.phase("reward", ctx.reward_manager, batch)
        return ctx.phase("adv", compute_advantages, ctx.algorithm, batch)  # no update

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _drop_last_group(ctx, batch):
    """A filter that drops a prompt's group and does not generate more."""
    return batch.select_idxs(list(range(len(batch) - ctx.n)))


def _hidden_counter():
    """A phase that carries state between steps outside any state_dict (a closure)."""
    calls = {"n": 0}

    def scale(ctx, batch):
        calls["n"] += 1
        batch.batch["advantages"] = batch.batch["advantages"] * calls["n"]
        return batch

    return scale


def test_a_program_that_forgets_to_update_fails_step_updates_actor():
    from rlcore.testing.conformance import check_step_program

    with pytest.raises(AssertionError, match="step-updates-actor: step 0 called update_actor 0"):
        check_step_program(lambda: _algorithm_with(_ForgetsTheUpdate))


def test_a_program_that_loses_rows_fails_step_keeps_rows():
    from rlcore.rl.step import StepProgram
    from rlcore.testing.conformance import check_step_program

    rule = r"step-keeps-rows: step 0: the actor trained on 6 rows"
    with pytest.raises(AssertionError, match=rule):
        check_step_program(
            lambda: _algorithm_with(lambda: StepProgram(after_generate=(_drop_last_group,)))
        )


def test_a_program_with_state_outside_its_state_dict_fails_step_resumable():
    from rlcore.rl.step import StepProgram
    from rlcore.testing.conformance import check_step_program

    def make():
        return _algorithm_with(lambda: StepProgram(before_update=(_hidden_counter(),)))

    with pytest.raises(AssertionError, match="step-resumable: step 1 after a resume"):
        check_step_program(make)


def test_state_kept_in_the_program_state_dict_passes_step_resumable():
    from rlcore.rl.step import StepProgram
    from rlcore.testing.conformance import check_step_program

    class Counting(StepProgram):
        def __init__(self):
            super().__init__(before_update=(self.scale,))
            self.calls = 0

        def scale(self, ctx, batch):
            self.calls += 1
            batch.batch["advantages"] = batch.batch["advantages"] * self.calls
            return batch

        def state_dict(self):
            return {"calls": self.calls}

        def load_state_dict(self, state):
            self.calls = int(state["calls"])

    check_step_program(lambda: _algorithm_with(Counting))


def test_global_rng_is_part_of_the_resumed_state():
    """A program drawing from Python's RNG resumes exactly: a checkpoint holds the RNG."""
    from rlcore.rl.step import StepProgram
    from rlcore.testing.conformance import check_step_program

    def jitter(ctx, batch):
        batch.batch["advantages"] = batch.batch["advantages"] + random.random()
        return batch

    check_step_program(lambda: _algorithm_with(lambda: StepProgram(before_update=(jitter,))))


# --- the phase helper ---------------------------------------------------------------------------


def test_phase_times_the_call_and_takes_worker_and_driver_metrics():
    from rlcore.protocol import DataProto
    from rlcore.testing.conformance._step import _Context

    ctx = _Context(
        policy=None, critic=None, algorithm=_grpo(), reward_manager=None, step=0,
        next_prompts=lambda: DataProto(), n=1, sampling=None,
    )  # fmt: skip

    def worker_call():
        metrics = {"timing_s/worker/fwd": [1.0, 3.0], "a/x": [1.0, 2.0]}
        return DataProto(meta_info={"metrics": metrics})

    out = ctx.phase("fwd", worker_call)
    assert "metrics" not in out.meta_info  # taken, so it does not travel on with the batch
    ctx.phase("fwd", worker_call)  # a second forward pass in the same step
    assert ctx.worker_metrics == {"timing_s/worker/fwd": 6.0, "a/x": 1.5}  # slowest rank, summed
    assert ctx.phase("drv", lambda: ("value", {"d/y": 2.0})) == "value"
    assert ctx.metrics["d/y"] == 2.0
    assert ctx.metrics["a/x/round_2"] == 1.5  # "fwd" ran twice: its rounds are logged too
    assert ctx.phases == ["fwd", "fwd", "drv"]
    assert set(ctx.timing) == {"fwd", "drv"}
    assert all(t >= 0.0 for t in ctx.timing.values())


def test_a_repeated_phase_logs_each_round_and_all_rounds():
    """Issue 49 item 4: a resampling program scores twice in a step. Each round's metrics
    and time are logged as <name>/round_<r>; the plain name is over all rounds (mean, or sum
    for a metric declared calls="sum"; times summed). Before, the last round's reward
    metrics were the step's and the rounds' times only summed."""
    from rlcore.protocol import DataProto
    from rlcore.testing.conformance._step import _Context
    from rlcore.tracking.reductions import Reduction, declare_reduction

    declare_reduction("test_rounds/kept", Reduction(calls="sum"))
    ctx = _Context(
        policy=None, critic=None, algorithm=_grpo(), reward_manager=None, step=0,
        next_prompts=lambda: DataProto(), n=1, sampling=None,
    )  # fmt: skip
    rounds = iter([{"reward/mean": 0.25, "test_rounds/kept": 3.0}, {"reward/mean": 0.75}])
    for _ in range(2):
        ctx.phase("reward", lambda: ("scored", next(rounds)))
    ctx.phase("gen", lambda: DataProto(meta_info={"metrics": {"gen/x": [4.0]}}))  # once
    m = ctx.metrics
    assert m["reward/mean/round_1"] == 0.25
    assert m["reward/mean/round_2"] == 0.75
    assert m["reward/mean"] == 0.5  # both rounds, not the last one
    assert m["test_rounds/kept"] == 3.0
    assert m["test_rounds/kept/round_1"] == 3.0
    seconds = m["timing_s/reward/round_1"] + m["timing_s/reward/round_2"]
    assert ctx.timing["reward"] == pytest.approx(seconds)  # timing_s/reward: summed
    assert not any(k.startswith(("gen/x/", "timing_s/gen/")) for k in m)  # one round: plain
    assert ctx.worker_metrics == {"gen/x": 4.0}


# --- declared reductions ------------------------------------------------------------------------


def test_reductions_are_declared_per_metric_and_unknown_ones_are_means():
    from rlcore.tracking.reductions import (
        MAX,
        SUM,
        Reduction,
        declare_reduction,
        reduce_metrics,
        reduction_of,
    )

    declare_reduction("test/tokens", SUM)
    declare_reduction("test/family/", MAX)
    out = reduce_metrics(
        {"test/tokens": [1, 2, 3], "test/family/a": [1.0, 5.0], "test/loss": [1.0, 2.0], "k": 4}
    )
    assert out == {"test/tokens": 6.0, "test/family/a": 5.0, "test/loss": 1.5, "k": 4.0}
    assert reduction_of("rollout/logprob_diff_max") == MAX
    assert reduction_of("timing_s/worker/generate") == Reduction(ranks="max", calls="sum")
    assert reduction_of("actor/entropy_max_like_name") == Reduction()  # no name guessing
    with pytest.raises(ValueError, match="already declared"):
        declare_reduction("test/tokens", MAX)


# --- the loop plan -------------------------------------------------------------------------------


def test_loop_plan_cadence():
    from rlcore.trainer.plan import LoopPlan

    plan = LoopPlan(total_steps=5, test_freq=2, save_freq=3, validate=True)
    assert [s for s in range(1, 6) if plan.validate_after(s)] == [2, 4, 5]
    assert [s for s in range(1, 6) if plan.save_after(s)] == [3, 5]
    assert plan.save_after(1, interrupted=True)
    assert plan.validate_before(resumed=False)
    assert not plan.validate_before(resumed=True)
    no_val = LoopPlan(total_steps=5, test_freq=2, validate=False)
    assert not any(no_val.validate_after(s) for s in range(1, 6))
    assert not no_val.validate_before(resumed=False)


# --- extra roles: declaration, config, checks ----------------------------------------------------


def test_extra_roles_are_declared_through_needs():
    from rlcore_grpo.algorithm import GRPO

    class Distill(GRPO):
        @property
        def extra_roles(self):
            return (ExtraRole(name="teacher"),)

    needs = Distill().needs
    assert isinstance(needs, AlgorithmNeeds)
    assert needs.extra_roles == (ExtraRole(name="teacher"),)
    assert needs.extra_roles[0].output_key == "teacher_log_prob"
    with pytest.raises(ValueError):
        ExtraRole(name="Bad Name")


def test_a_declared_role_reaches_the_program_as_ctx_roles():
    from rlcore.rl.step import StepProgram
    from rlcore.testing.conformance import check_step_program
    from rlcore_grpo.algorithm import GRPO

    def teacher(ctx, batch):
        role = ctx.roles["teacher"]
        return batch.union(ctx.phase("teacher", role.compute_log_prob, ctx.model_in))

    class Distill(GRPO):
        @property
        def extra_roles(self):
            return (ExtraRole(name="teacher"),)

        def step_program(self):
            return StepProgram(before_update=(teacher,))

    from rlcore.testing.conformance._step import _Run

    run = _Run(Distill, batch_size=2, n=2)
    run.step(0)
    assert "teacher_log_prob" in run.policy.updates[-1].batch
    check_step_program(Distill)


# --- issue 49 items 6-7: the algorithm guide documents what an author reads ----------------


def test_the_algorithm_guide_documents_its_blocks_metrics_and_the_starting_accuracy():
    from pathlib import Path

    from rlcore.testing.conformance import POLICY_METRICS

    guide = (Path(__file__).resolve().parents[1] / "docs" / "writing-an-algorithm.md").read_text()
    table = guide.split("Its blocks:", 1)[1].split("### Inserting phases", 1)[0]
    for block in ("ctx.phase(", "ctx.generate(", "ctx.log_probs_and_values(", "ctx.reward("):
        assert f"`{block}" in table, block
    assert 'ctx.phase("reward", ctx.reward_manager' not in guide  # the step as it is written
    for name in POLICY_METRICS:  # check_algorithm's defaults, named for the author
        assert f"`{name}`" in guide, name
    section = guide.split("## Check your starting accuracy", 1)[1]
    assert "5.5%" in section
    assert "36 to 42 points" in section
