"""Distillation end to end: real Ray workers (FSDP2 actor and teacher, HF rollout, GSM8K reward)
through ``run_training``, the tiny run's model as the student.

- teacher = the student's own folder: the reverse KL is 0 and so is every advantage; with
  ``reward_weight = 0`` nothing trains (the exported actor equals the student);
- teacher = a sharper model (the student's weights, output layer scaled): the teacher phase
  runs every step, ``distill/reverse_kl`` is logged, the exact KL to the teacher falls,
  the teacher role is checkpointed (its folder in the step) and the run resumes from it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

# the training prompts, "What is a + b?"
PAIRS = [(a, b) for a in range(4) for b in range(4)]

# resources.placement: the teacher (a frozen role) in a worker group on a pool of its own
PLACED = 'placement = { teacher = "aux" }\n[resources.pools.aux]\nprocesses_per_node = 1\n'


def _config(
    tmp_path: Path, *, model: Path, teacher: Path, run: str, steps: int, placed: str = "", **knobs
):
    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_toml, write_jsonl

    train = write_jsonl(arithmetic_rows(PAIRS), tmp_path / "train.jsonl")
    text = tiny_run_toml(
        model=model,
        train_files=[train],
        run_dir=tmp_path / run,
        algorithm="distill",
        total_steps=steps,
        save_freq=2,
        **knobs,
        extra=f"{placed}[roles.teacher]\nmodel = {{ path = {json.dumps(str(teacher))} }}\n",
    )
    text = text.replace("[trainer]\n", '[trainer]\nresume = "auto"\n')
    return load_config_text(text, source=f"{run}.toml")


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "distill/reverse_kl" in r]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in sorted(folder.glob("*.safetensors")):
        out |= load_file(f)
    return out


def _sharp_teacher(path: Path) -> Path:
    """The student's own random weights with the output layer scaled: a sharper distribution
    over the tokens the student already slightly prefers. A random student is near uniform
    and far from it; moving toward it is one coherent direction (sharpen), so the reverse KL's
    gradient stands above the sampling noise of a few dozen tokens, which it does not against
    an unrelated random teacher over a 260-token vocabulary (measured: no fall in 5 steps)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcore.testing.runs import tiny_run_model

    tiny_run_model(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(_TEACHER_SHARPNESS)
    model.save_pretrained(path, safe_serialization=True)
    return path


_TEACHER_SHARPNESS = 5.0


@pytest.mark.slow
@pytest.mark.parametrize("placed", ["", PLACED], ids=["colocated", "teacher-on-its-own-pool"])
def test_a_teacher_equal_to_the_student_gives_zero_kl_and_trains_nothing(
    ray_session, tmp_path, placed
):
    import torch

    from rlcore.testing.runs import tiny_run_model
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    config = _config(
        tmp_path, model=model, teacher=model, run="same", steps=2, lr=1e-2, placed=placed
    )
    assert config.resources.pool_of("teacher") == ("aux" if placed else "global_pool")
    assert run_training(config) == 0
    steps = _steps(tmp_path / "same")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert abs(r["distill/reverse_kl"]) < 1e-6, r["distill/reverse_kl"]
        assert abs(r["critic/advantages/max"]) < 1e-6
        assert abs(r["critic/advantages/min"]) < 1e-6
        assert r["distill/teacher_log_prob_mean"] == pytest.approx(
            r["distill/student_log_prob_mean"], abs=1e-6
        )
        assert "timing_s/teacher" in r
        assert "critic/score/mean" in r  # the reward is still computed and logged
    before, after = _weights(model), _weights(tmp_path / "same" / "final_hf")
    assert before.keys() == after.keys()
    moved = max(float((before[k].float() - after[k].float()).abs().max()) for k in before)
    assert moved < 1e-6, f"the student moved by {moved} with a zero advantage"
    assert torch.isfinite(torch.tensor(moved))


@pytest.mark.slow
def test_a_sharper_teacher_lowers_the_reverse_kl_and_the_run_resumes(ray_session, tmp_path):
    from rlcore.testing.runs import tiny_run_model
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    teacher = _sharp_teacher(tmp_path / "teacher")
    # 16 prompts x 4 samples x 8 tokens a step: enough tokens that the per-token estimate's
    # noise (about 0.6 per token) is below the step-to-step change
    knobs = {"train_batch_size": 16, "n": 4, "micro_batch_size": 64, "lr": 3e-3}
    config = _config(tmp_path, model=model, teacher=teacher, run="other", steps=6, **knobs)
    assert run_training(config) == 0
    step_dir = tmp_path / "other" / "checkpoints" / "global_step_6"
    assert sorted(p.name for p in (step_dir / "teacher").iterdir()) == ["worker_state_rank0.pt"]
    # resumed from step 6 for two more: the teacher's checkpoint folder is read back
    resumed = _config(tmp_path, model=model, teacher=teacher, run="other", steps=8, **knobs)
    assert run_training(resumed) == 0
    steps = _steps(tmp_path / "other")
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6, 7, 8]
    kl = [r["distill/reverse_kl"] for r in steps]
    for r in steps:
        assert "timing_s/teacher" in r
        assert "timing_s/worker/teacher_forward" in r
        assert math.isfinite(r["distill/reverse_kl"])
        assert r["distill/teacher_log_prob_mean"] < 0.0
        assert r["distill/kl_advantage_mean"] == pytest.approx(-r["distill/reverse_kl"], abs=1e-5)
        assert "actor/pg_loss" in r
    assert kl[0] > 0.0  # the teacher is sharper than the student
    # The student moved toward the teacher. Not read off the logged estimate: it is a sample
    # mean over 512 tokens whose step-to-step noise (about 0.03) is as large as its fall over
    # 8 steps (measured, seeds 0-2: the last three steps' sum above the first three's in 2 of
    # 6 runs, either sampler). The exact KL over the whole vocabulary on fixed contexts has no
    # sampling noise (measured, seeds 0-2: 0.203 before, 0.187-0.192 after).
    before = _exact_reverse_kl(model, teacher)
    after = _exact_reverse_kl(tmp_path / "other" / "final_hf", teacher, tokenizer=model)
    assert after < 0.97 * before, (before, after)


def _exact_reverse_kl(student: Path, teacher: Path, tokenizer: Path | None = None) -> float:
    """KL(student || teacher) summed over the vocabulary, averaged over the positions of the
    teacher's greedy 8-token answer to each training prompt (fixed contexts, no sampling)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.testing.runs import arithmetic_rows

    tok = AutoTokenizer.from_pretrained(tokenizer or student)
    s = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).eval()
    t = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.float32).eval()
    kls = []
    with torch.no_grad():
        for row in arithmetic_rows(PAIRS):
            ids = tok.apply_chat_template(
                row["prompt"], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            seq = t.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            answer = slice(ids.shape[1] - 1, -1)  # the logits that predict the answer
            ls = torch.log_softmax(s(seq).logits[0, answer], -1)
            lt = torch.log_softmax(t(seq).logits[0, answer], -1)
            kls.append((ls.exp() * (ls - lt)).sum(-1).mean())
    return float(torch.stack(kls).mean())
