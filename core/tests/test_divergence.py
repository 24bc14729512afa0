"""The divergence guard's gradient-norm ceiling (the log-prob check runs in
``tests/test_stop_signals.py`` on a real diverged run)."""

from __future__ import annotations

import pytest

from rlcore.errors import ConfigError
from rlcore.trainer.divergence import DivergenceError, check_grad_norm, grad_norm_ceiling


def test_the_ceiling_comes_from_the_environment():
    assert grad_norm_ceiling({}) is None
    assert grad_norm_ceiling({"RLCORE_MAX_GRAD_NORM": "  "}) is None
    assert grad_norm_ceiling({"RLCORE_MAX_GRAD_NORM": "50"}) == 50.0
    for bad in ("abc", "0", "-1", "inf", "nan"):
        with pytest.raises(ConfigError) as info:
            grad_norm_ceiling({"RLCORE_MAX_GRAD_NORM": bad})
        assert str(info.value) == (
            f"RLCORE_MAX_GRAD_NORM={bad!r}: expected a positive number (the gradient-norm "
            "ceiling); unset it for none"
        )


def test_a_norm_above_the_ceiling_stops_the_run():
    env = {"RLCORE_MAX_GRAD_NORM": "10"}
    check_grad_norm({"actor/grad_norm": 9.5, "critic/grad_norm": 10.0}, 3, env)
    check_grad_norm({"actor/grad_norm": float("nan")}, 3, env)  # skipped by the engine
    check_grad_norm({"actor/grad_norm": 1e9}, 3, {})  # no ceiling set
    with pytest.raises(DivergenceError) as info:
        check_grad_norm({"actor/grad_norm": 9.0, "critic/grad_norm": 12.5}, 4, env)
    assert str(info.value) == (
        "step 4: critic/grad_norm = 12.5 exceeds RLCORE_MAX_GRAD_NORM = 10; stopping without "
        "saving it; lower actor.optim.lr (or critic.optim.lr) or set actor.grad_clip, then "
        "resume from the last checkpoint"
    )


def test_the_ceiling_is_a_config_key_the_environment_overrides():
    assert grad_norm_ceiling({}, configured=20.0) == 20.0
    assert grad_norm_ceiling({"RLCORE_MAX_GRAD_NORM": "50"}, configured=20.0) == 50.0
    check_grad_norm({"actor/grad_norm": 19.0}, 2, {}, configured=20.0)
    with pytest.raises(DivergenceError) as info:
        check_grad_norm({"actor/grad_norm": 25.0}, 2, {}, configured=20.0)
    assert str(info.value).startswith(
        "step 2: actor/grad_norm = 25 exceeds trainer.grad_norm_ceiling = 20; stopping"
    )
    # The variable wins, and the line names it.
    check_grad_norm({"actor/grad_norm": 25.0}, 2, {"RLCORE_MAX_GRAD_NORM": "30"}, configured=20.0)
    with pytest.raises(DivergenceError) as info:
        check_grad_norm({"actor/grad_norm": 25.0}, 2, {"RLCORE_MAX_GRAD_NORM": "24"}, configured=9)
    assert "exceeds RLCORE_MAX_GRAD_NORM = 24;" in str(info.value)


def test_the_config_key_is_validated():
    from rlcore.config.convert import structure
    from rlcore.config.schema import TrainerConfig

    ok, problems = structure({"grad_norm_ceiling": 5}, TrainerConfig, ("trainer",))
    assert (ok.grad_norm_ceiling, problems) == (5.0, [])
    for bad, message in (
        (0, "must be > 0.0, got 0.0"),
        (-1.5, "must be > 0.0, got -1.5"),
        (float("inf"), "expected a finite number, got inf"),
        ("10", 'expected a number, got "10"'),
    ):
        _, problems = structure({"grad_norm_ceiling": bad}, TrainerConfig, ("trainer",))
        assert problems == [(("trainer", "grad_norm_ceiling"), message)], bad
