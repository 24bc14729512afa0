"""Bad-input catalogue: an algorithm's extra roles against ``[roles.<name>]``. Each case is
one exact line from ``rlcore train`` (exit 2, no traceback), before Ray starts."""

from __future__ import annotations

import _bad_inputs as bi
import pytest

from rlcore.hookspecs import hookimpl
from rlcore.interfaces import CONTRACT_VERSION, ExtraRole
from rlcore.plugins import PluginRegistry
from rlcore_grpo.algorithm import GRPO

registry, tiny, run = bi.registry, bi.tiny, bi.run  # fixtures


class WithTeacher(GRPO):
    @property
    def extra_roles(self):
        return (ExtraRole(name="teacher"),)


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


def test_a_declared_role_without_a_model_path_is_one_line(run, capsys, teacher_registry):
    bi.case(
        run,
        capsys,
        teacher_registry,
        ['algorithm.name="with_teacher"'],
        "roles.teacher.model.path: algorithm 'with_teacher' needs the role 'teacher' "
        "(log_prob); set it to a local Hugging Face model folder",
    )


def test_a_teacher_path_that_does_not_exist_is_one_line(run, capsys, teacher_registry, tmp_path):
    missing = tmp_path / "no-teacher"
    bi.case(
        run,
        capsys,
        teacher_registry,
        ['algorithm.name="with_teacher"', f'roles.teacher.model.path="{missing}"'],
        f"roles.teacher.model.path: {missing} does not exist; give a local Hugging Face "
        "model folder",
    )


def test_a_roles_section_no_algorithm_declares_is_one_line(run, capsys, registry, tiny):
    bi.case(
        run,
        capsys,
        registry,
        [f'roles.teacher.model.path="{tiny}"'],
        "[roles.teacher]: algorithm 'grpo' declares no role 'teacher' (its extra roles: "
        "none); remove the section or select the algorithm that uses it",
    )


def test_roles_keys_are_validated_like_the_others(run, capsys, registry):
    code, err = bi.cli(
        ["config", "validate", str(run), "roles.teacher.modle.path=1"], capsys, registry
    )
    assert code == 2
    assert "roles.teacher.modle: unknown key (did you mean 'model'?)" in err
