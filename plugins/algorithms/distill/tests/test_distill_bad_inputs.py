"""Bad inputs of a distillation run: each one exact line from ``rlcore train`` / ``rlcore
config validate`` (exit 2, no traceback), before Ray starts (helpers: tests/_bad_inputs.py)."""

from __future__ import annotations

import _bad_inputs as bi

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures


def test_distill_without_a_teacher_section_is_one_line(run, capsys, registry):
    bi.case(
        run,
        capsys,
        registry,
        ['algorithm.name="distill"'],
        "roles.teacher.model.path: algorithm 'distill' needs the role 'teacher' (log_prob); "
        "set it to a local Hugging Face model folder",
    )


def test_a_teacher_path_that_does_not_exist_is_one_line(run, capsys, registry, tmp_path):
    missing = tmp_path / "runs" / "quickstart-grpo-seed0" / "final_hf"
    bi.case(
        run,
        capsys,
        registry,
        ['algorithm.name="distill"', f'roles.teacher.model.path="{missing}"'],
        f"roles.teacher.model.path: {missing} does not exist; give a local Hugging Face "
        "model folder",
    )


def test_a_teacher_folder_without_config_json_is_one_line(run, capsys, registry, tmp_path):
    empty = tmp_path / "teacher"
    empty.mkdir()
    bi.case(
        run,
        capsys,
        registry,
        ['algorithm.name="distill"', f'roles.teacher.model.path="{empty}"'],
        f"roles.teacher.model.path: {empty} has no config.json; it is not a Hugging Face "
        "model folder",
    )


def _validate(run, capsys, registry, overrides):
    return bi.cli(["config", "validate", str(run), *overrides], capsys, registry)


def test_coefficients_are_validated_naming_the_key(run, capsys, registry, tiny):
    teacher = [f'roles.teacher.model.path="{tiny}"', 'algorithm.name="distill"']
    for override, line in (
        ("algorithm.teacher_kl_coef=-1", "algorithm.teacher_kl_coef: must be >= 0.0, got -1.0"),
        ("algorithm.reward_weight=-0.5", "algorithm.reward_weight: must be >= 0.0, got -0.5"),
        (
            "algorithm.teacher_kl_coef=0",
            "algorithm: teacher_kl_coef and reward_weight are both 0: the advantage is 0, "
            "nothing trains",
        ),
    ):
        code, err = _validate(run, capsys, registry, [*teacher, override])
        bi.assert_one_line(code, err, f"{run}: {line}")


def test_a_teacher_with_another_tokenizer_is_one_line(run, capsys, registry, tiny, tmp_path):
    """The teacher's log-probs are of the student's token ids: a teacher whose tokenizer has
    40 tokens more (here the student's, extended) trained without a word before."""
    from transformers import AutoTokenizer

    teacher = bi.model_copy(tiny, tmp_path / "teacher")
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    size = len(tokenizer)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(40)])
    tokenizer.save_pretrained(teacher)
    bi.case(
        run,
        capsys,
        registry,
        ['algorithm.name="distill"', f'roles.teacher.model.path="{teacher}"'],
        f"roles.teacher.model.path: the tokenizer in {teacher} ({size + 40} tokens) is not the "
        f"policy's (model.tokenizer_path, {size} tokens): 40 tokens only in the role's (first: "
        "'<extra_0>'); the role scores the policy's token ids, so give it a model trained with "
        "the policy's tokenizer",
    )


def test_a_teacher_with_the_students_tokenizer_passes(run, capsys, registry, tiny, tmp_path):
    from rlcore.config import load_config
    from rlcore.preflight.roles import check_role_tokenizer

    teacher = bi.model_copy(tiny, tmp_path / "teacher")  # its own copy of the same tokenizer
    config = load_config(run, registry=registry)
    check_role_tokenizer(config, "teacher", str(teacher))
