"""The divergence guard's gradient-norm ceiling (the log-prob check runs in
``tests/test_stop_signals.py`` on a real diverged run)."""

from __future__ import annotations

import pytest

from rlcore.divergence import DivergenceError, check_grad_norm, grad_norm_ceiling
from rlcore.errors import ConfigError


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
