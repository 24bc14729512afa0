"""Extra roles from an algorithm: placed beside the policy, called from the algorithm's step
program, checkpointed and resumed like the built-in roles (real Ray workers, FSDP2, HF
rollout). The checks before Ray are in ``test_bad_inputs_roles.py``.

Workers unpickle the in-process algorithm by its module: this one imports only what they
can import too (not the tests' helpers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest
import torch

from rlcore.hookspecs import hookimpl
from rlcore.interfaces import CONTRACT_VERSION, ExtraRole
from rlcore.plugins import PluginRegistry
from rlcore.rl.step import StepProgram
from rlcore_grpo.algorithm import GRPO


def teacher_phase(ctx, batch):
    """Before the update: the teacher's log-probs of the sampled responses, into the batch."""
    batch |= ctx.phase("teacher", ctx.roles["teacher"].compute_log_prob, ctx.model_in)
    mask = batch.batch["response_mask"].to(torch.float32)
    logp = batch.batch["teacher_log_prob"]
    ctx.metrics["teacher/log_prob_mean"] = float((logp * mask).sum() / mask.sum())
    return batch


class WithTeacher(GRPO):
    """GRPO plus a teacher role whose log-probs travel with the update's rows."""

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        pass

    @property
    def extra_roles(self):
        return (ExtraRole(name="teacher"),)

    @property
    def needs(self):
        return attrs.evolve(super().needs, loss_keys=("teacher_log_prob",))

    def step_program(self):
        return StepProgram(before_update=(teacher_phase,))


class TeacherPlugin:
    contract_version = CONTRACT_VERSION

    @staticmethod
    @hookimpl
    def register_algorithms():
        return {"with_teacher": WithTeacher}


@pytest.fixture(scope="module")
def teacher_registry():
    reg = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    reg.register(TeacherPlugin(), name="teacher-test")
    return reg


# --- end to end: placed, called, checkpointed, resumed ---------------------------------------


def _config(tmp_path: Path, reg, model: Path, total_steps: int):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_toml, write_jsonl

    train = write_jsonl(arithmetic_rows([(a, 1) for a in range(8)]), tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / "run",
        algorithm="with_teacher",
        total_steps=total_steps,
        save_freq=1,
        extra=f'[roles.teacher]\nmodel = {{ path = "{model}" }}\n',
    )
    text = text.replace("[trainer]\n", '[trainer]\nresume = "auto"\n')
    return load_config_text(text, source="teacher.toml", registry=reg)


@pytest.mark.slow
def test_a_teacher_role_is_placed_called_checkpointed_and_resumed(
    ray_session, tmp_path, teacher_registry
):
    from rlcore.testing.runs import tiny_run_model
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    assert (
        run_training(_config(tmp_path, teacher_registry, model, 2), registry=teacher_registry) == 0
    )
    step = tmp_path / "run" / "checkpoints" / "global_step_2"
    assert sorted(p.name for p in (step / "teacher").iterdir()) == ["worker_state_rank0.pt"]

    # Resume from step 2 for one more step: the teacher's checkpoint folder is read back.
    assert (
        run_training(_config(tmp_path, teacher_registry, model, 3), registry=teacher_registry) == 0
    )
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "teacher/log_prob_mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        assert "timing_s/teacher" in r
        assert "timing_s/worker/teacher_forward" in r
        assert math.isfinite(r["teacher/log_prob_mean"])
        assert r["teacher/log_prob_mean"] < 0.0
