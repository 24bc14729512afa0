"""The divergence guard's gradient-norm ceiling (the log-prob check runs in
``tests/test_stop_signals.py`` on a real diverged run)."""

from __future__ import annotations

import pytest

from rlcore.trainer.divergence import DivergenceError, check_grad_norm


def test_a_norm_above_the_ceiling_stops_the_run():
    check_grad_norm({"actor/grad_norm": 9.5, "critic/grad_norm": 10.0}, 3, 10.0)
    check_grad_norm({"actor/grad_norm": float("nan")}, 3, 10.0)  # skipped by the engine
    check_grad_norm({"actor/grad_norm": 1e9}, 3, None)  # no ceiling set
    with pytest.raises(DivergenceError) as info:
        check_grad_norm({"actor/grad_norm": 9.0, "critic/grad_norm": 12.5}, 4, 10.0)
    assert str(info.value) == (
        "step 4: critic/grad_norm = 12.5 exceeds trainer.grad_norm_ceiling = 10; stopping "
        "without saving it; lower actor.optim.lr (or critic.optim.lr) or set actor.grad_clip, "
        "then resume from the last checkpoint"
    )
    # RLCORE_MAX_GRAD_NORM maps onto the key in the CLI: core/tests/test_config_knobs.py.


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
