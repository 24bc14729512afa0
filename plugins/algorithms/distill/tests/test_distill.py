"""On-policy distillation: the advantage formula on hand-made tensors, the mix with GRPO's
advantage, the conformance checks (the teacher role on the step harness), and the order of the
phases (the teacher's log-probs before the advantages)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.protocol import DataProto
from rlcore.testing.conformance import check_algorithm, check_plugin_module, check_step_program
from rlcore_distill.algorithm import TEACHER, Distill, distill_advantages, distill_metrics
from rlcore_grpo.algorithm import GRPO


def _distill(**options):
    return Distill(Distill.Config(**options))


def test_plugin_module():
    assert check_plugin_module("rlcore_distill.plugin") == {
        "algorithm/distill": "rlcore_distill.algorithm:Distill"
    }


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"reward_weight": 0.5},
        {"teacher_kl_coef": 0.0, "reward_weight": 1.0},
        {"use_kl_loss": True},
    ],
)
def test_algorithm_conformance(options):
    check_algorithm(Distill, Distill.Config(**options))


def test_step_program_conformance():
    check_step_program(_distill)
    check_step_program(lambda: _distill(reward_weight=0.5, teacher_kl_coef=0.1))
    check_step_program(lambda: _distill(use_kl_loss=True))


def test_needs_a_teacher_and_the_old_log_prob_pass_and_no_critic():
    needs = _distill().needs
    assert needs.extra_roles == (TEACHER,)
    assert TEACHER.output_key == "teacher_log_prob"
    assert needs.old_log_probs_on_driver  # the advantage reads the student's log-probs
    assert not needs.critic
    assert not needs.reference
    config = Distill.Config()
    assert config.loss_agg_mode == "token-mean"
    assert (config.teacher_kl_coef, config.reward_weight) == (1.0, 0.0)


def test_the_advantage_is_minus_the_per_token_reverse_kl_and_zero_under_the_mask():
    student = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -0.7, -9.0, -9.0]])
    teacher = torch.tensor([[-1.5, -1.0, -0.5, -1.0], [-0.4, -0.1, -math.inf, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv = distill_advantages(student, teacher, mask, teacher_kl_coef=2.0)
    # A_t = -teacher_kl_coef * (logp_s - logp_t) on valid tokens, exactly 0 elsewhere (even
    # -inf, nan)
    expected = torch.tensor([[-1.0, 2.0, 0.0, 0.0], [-0.4, 1.2, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert bool((adv[mask == 0] == 0).all())
    assert not adv.requires_grad


def test_the_advantage_carries_no_gradient():
    student = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = distill_advantages(student, torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2))
    assert not adv.requires_grad


def test_a_teacher_equal_to_the_student_gives_zero_advantage_and_zero_reverse_kl():
    batch = _batch(teacher_is_student=True)
    out = _distill().compute_advantages(batch)
    assert bool((out.batch["advantages"] == 0).all())
    metrics = distill_metrics(out, teacher_kl_coef=1.0, reward_weight=0.0)
    assert metrics["distill/reverse_kl"] == 0.0
    assert metrics["distill/kl_advantage_abs_mean"] == 0.0


def _batch(*, teacher_is_student: bool = False, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 5
    lengths = torch.tensor([5, 3, 1, 4, 2, 5])
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    student = -3.0 * torch.rand(rows, width, generator=g)
    teacher = student.clone() if teacher_is_student else -3.0 * torch.rand(rows, width, generator=g)
    scores = torch.zeros(rows, width)
    scores[torch.arange(rows), lengths - 1] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    return DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "old_log_probs": student,
            "teacher_log_prob": teacher,
            "token_level_rewards": scores,
        },
        non_tensors={"uid": np.array(["a", "a", "b", "b", "c", "c"], dtype=object)},
    )


def test_the_reward_part_is_grpos_advantage_weighted():
    w, c = 0.3, 0.5
    mixed = _distill(teacher_kl_coef=c, reward_weight=w).compute_advantages(_batch())
    grpo = GRPO(GRPO.Config()).compute_advantages(_batch())
    b = _batch().batch
    kl_part = -c * (b["old_log_probs"] - b["teacher_log_prob"]) * b["response_mask"]
    expected = kl_part + w * grpo.batch["advantages"]
    assert torch.allclose(mixed.batch["advantages"], expected, atol=1e-6)
    metrics = distill_metrics(mixed, teacher_kl_coef=c, reward_weight=w)
    m = b["response_mask"].bool()
    assert metrics["distill/reward_advantage_mean"] == pytest.approx(
        float((w * grpo.batch["advantages"])[m].mean()), abs=1e-6
    )
    assert metrics["distill/kl_advantage_mean"] == pytest.approx(float(kl_part[m].mean()), abs=1e-6)
    rkl = (b["old_log_probs"] - b["teacher_log_prob"])[m].mean()
    assert metrics["distill/reverse_kl"] == pytest.approx(float(rkl), abs=1e-6)
    assert metrics["distill/teacher_log_prob_mean"] == pytest.approx(
        float(b["teacher_log_prob"][m].mean()), abs=1e-6
    )


def test_without_reward_weight_the_reward_does_not_move_the_advantage():
    flipped = _batch()
    flipped.batch["token_level_rewards"] = 1.0 - flipped.batch["token_level_rewards"]
    a = _distill().compute_advantages(_batch()).batch["advantages"]
    b = _distill().compute_advantages(flipped).batch["advantages"]
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"teacher_kl_coef": 0.0}, "teacher_kl_coef and reward_weight are both 0"),
        ({"reward_weight": 1.0, "adv_estimator": None}, "reward_weight > 0 needs an adv_estimator"),
        ({"teacher_kl_coef": -1.0}, "'teacher_kl_coef' must be >= 0.0"),
        ({"reward_weight": -0.5}, "'reward_weight' must be >= 0.0"),
    ],
)
def test_bad_coefficients_are_refused(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Distill.Config(**options)


def test_the_teacher_phase_runs_before_the_advantages_and_its_log_probs_reach_them():
    from rlcore.testing.conformance._step import _Run

    run = _Run(_distill, batch_size=4, n=2)
    ctx = run.step(0)
    assert ctx.phases == ["gen", "old_log_prob", "teacher", "reward", "adv", "update_actor"]
    update = run.policy.updates[-1]
    b = update.batch
    expected = distill_advantages(b["old_log_probs"], b["teacher_log_prob"], b["response_mask"])
    assert torch.equal(b["advantages"], expected)
    assert ctx.metrics["distill/reverse_kl"] == pytest.approx(
        float((b["old_log_probs"] - b["teacher_log_prob"])[b["response_mask"].bool()].mean())
    )
    assert "reward/mean" in ctx.metrics  # the reward is still computed and logged
    assert "timing_s/teacher" not in ctx.metrics  # timings live in ctx.timing
    assert "teacher" in ctx.timing


def test_the_core_never_names_the_plugin():
    """Written only against the public API: no core module imports or names the package."""
    import rlcore

    core = Path(rlcore.__file__).parent
    hits = [
        str(p.relative_to(core))
        for p in core.rglob("*.py")
        if re.search(r"rlcore[_-]distill", p.read_text(encoding="utf-8"))
    ]
    assert hits == []
