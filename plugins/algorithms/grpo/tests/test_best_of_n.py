"""Best-of-n fine-tuning: conformance, and an update that gets the kept rows and no others."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlcore.testing.conformance import check_algorithm, check_step_program
from rlcore_grpo.best_of_n import BestOfN, best_rows


def test_best_rows_keeps_each_prompts_best_above_the_bar():
    uids = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    scores = [1.0, 0.0, 1.0, 0.0, 0.0, 0.5]
    assert best_rows(uids, scores, keep_per_prompt=1, min_score=1.0) == [0]
    assert best_rows(uids, scores, keep_per_prompt=2, min_score=0.5) == [0, 2, 5]


@pytest.mark.parametrize("options", [{}, {"loss_agg_mode": "seq-mean-token-mean"}])
def test_best_of_n_conformance(options):
    check_algorithm(BestOfN, BestOfN.Config(**options), policy_metrics=("actor/pg_loss",))


def test_the_update_trains_the_kept_rows_only_with_weight():
    """The step program under the conformance harness: each step's update holds only the
    rows best_rows keeps (scored 1 by the harness's reward, one per prompt), every one with
    a valid token and weight 1 on each; step-keeps-rows (subset form) passes, and so does the
    resume rule. The trainer's own layout then adds no row on one rank."""
    from rlcore.testing.conformance._step import _Run
    from rlcore.trainer.layout import mini_batch_layout

    check_step_program(lambda: BestOfN(BestOfN.Config(keep_per_prompt=1)), n=4)
    run = _Run(lambda: BestOfN(), batch_size=4, n=4)
    ctx = run.step(0)
    (rows,) = run.policy.updates
    mask = rows.batch["response_mask"]
    assert len(rows) == ctx.metrics["best_of_n/kept_rows"] > 0
    assert len(rows) < 16  # some rows dropped: they are not in the update at all
    assert bool((mask.sum(-1) > 0).all())  # no zero-weight (padding) row
    assert torch.equal(rows.batch["advantages"], mask.to(rows.batch["advantages"].dtype))
    assert rows.batch["token_level_scores"].sum(-1).tolist() == [1.0] * len(rows)
    assert len(set(rows.non_tensor_batch["uid"])) == len(rows)  # one per prompt
    laid = mini_batch_layout(
        rows.select(batch_keys=["response_mask"], non_tensor_batch_keys=[]),
        rows_per_mini_batch=16,
        mini_batches=1,
        world_size=1,
    )
    assert bool((laid.batch["response_mask"].sum(-1) > 0).all())
    assert laid.meta_info["mini_batch_rows"] == [len(rows)]
