"""A frozen model's worker (an extra role, the reward model) checkpoints which model it was,
in its own folder, and refuses a resume with another one, naming the key (no Ray needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlcore.checkpoint import CheckpointError
from rlcore.roles.extra_roles import ExtraRoleWorker
from rlcore.roles.reward_model import RewardModelWorker
from rlcore.workers.worker import WorkerSettings


def _spec(model_path: str, **extra: object) -> SimpleNamespace:
    engine = SimpleNamespace(spec=SimpleNamespace(model_path=model_path))
    return SimpleNamespace(settings=WorkerSettings(), engine=engine, retokenize="never", **extra)


@pytest.mark.parametrize(
    ("make", "folder", "key"),
    [
        (
            lambda p: ExtraRoleWorker(_spec(p, name="teacher")),
            "teacher",
            "roles.teacher.model.path",
        ),
        (lambda p: RewardModelWorker(_spec(p)), "rm", "reward_model.model.path"),
    ],
)
def test_a_frozen_model_resumes_only_with_the_model_it_was_saved_with(
    monkeypatch, tmp_path, make, folder, key
):
    # A rank-0 Worker picks a port when none is set: give it one so the test env stays as is.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(RuntimeError, match=f"Worker {folder}: call init_model"):
        make("models/a")._engine()
    make("models/a").save_checkpoint(str(tmp_path))
    assert (tmp_path / folder).is_dir()
    make("models/a").load_checkpoint(str(tmp_path))  # the same model: resumes
    with pytest.raises(CheckpointError, match=f"this run's {key} is 'models/b'"):
        make("models/b").load_checkpoint(str(tmp_path))
