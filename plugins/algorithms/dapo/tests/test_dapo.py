"""DAPO: verl's formulas (overlong penalty, filter_groups' keep rule), the conformance checks,
and dynamic sampling on the conformance harness: every trained group has differing rewards,
the rounds are bounded with one line naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.testing.conformance import check_algorithm, check_plugin_module, check_step_program
from rlcore_dapo.algorithm import (
    DAPO,
    DynamicSamplingError,
    FilterGroupsConfig,
    OverlongBufferConfig,
    keep_groups,
    overlong_penalty,
)


def _dapo(**options):
    return DAPO(DAPO.Config(**options))


def test_plugin_module():
    assert check_plugin_module("rlcore_dapo.plugin") == {
        "algorithm/dapo": "rlcore_dapo.algorithm:DAPO"
    }


@pytest.mark.parametrize("options", [{}, {"use_kl_loss": True}])
def test_algorithm_conformance(options):
    check_algorithm(DAPO, DAPO.Config(**options))


def test_step_program_conformance():
    check_step_program(_dapo)
    check_step_program(lambda: _dapo(overlong_buffer=OverlongBufferConfig(enable=True, len=2)))
    check_step_program(lambda: _dapo(filter_groups=FilterGroupsConfig(enable=False)))


def test_defaults_are_the_papers_clip_higher_and_token_mean():
    config = DAPO.Config()
    assert (config.clip_ratio_low, config.clip_ratio_high) == (0.2, 0.28)
    assert config.loss_agg_mode == "token-mean"


def test_overlong_penalty_is_verls_formula():
    # verl DAPORewardManager: expected_len = max_resp_len - buffer_len;
    # exceed_len = valid_response_length - expected_len;
    # overlong_reward = min(-exceed_len / buffer_len * penalty_factor, 0)
    lengths = torch.tensor([1, 4, 5, 6, 8])
    out = overlong_penalty(lengths, max_response_length=8, buffer_len=4, penalty_factor=0.5)
    expected = [min(-(n - 4) / 4 * 0.5, 0.0) for n in lengths.tolist()]
    assert out.tolist() == pytest.approx(expected)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.125, -0.25, -0.5])


def test_keep_groups_is_verls_rule():
    # keep a prompt when std(metric) > 0 or it has one sample
    uids = np.array(["a", "a", "b", "b", "c"], dtype=object)
    values = np.array([1.0, 1.0, 0.0, 1.0, 0.0])
    assert keep_groups(uids, values).tolist() == [2, 3, 4]


def _rewards_of(update) -> dict[str, list[float]]:
    scores = update.batch["token_level_rewards"].sum(-1).tolist()
    groups: dict[str, list[float]] = {}
    for uid, score in zip(update.non_tensor_batch["uid"], scores, strict=True):
        groups.setdefault(uid, []).append(score)
    return groups


def test_every_trained_group_has_differing_rewards_and_rounds_are_logged():
    from rlcore.testing.conformance._step import _Run

    run = _Run(
        lambda: _dapo(filter_groups=FilterGroupsConfig(metric="seq_reward")), batch_size=4, n=2
    )
    rounds = []
    for step in range(4):
        ctx = run.step(step)
        groups = _rewards_of(run.policy.updates[-1])
        assert len(groups) == 4
        assert all(len(set(v)) > 1 for v in groups.values()), groups
        rounds.append(ctx.metrics["train/num_gen_batches"])
        assert ctx.metrics["dapo/kept_groups"] >= 4
        assert ctx.phases.count("gen") == rounds[-1]
    assert max(rounds) > 1  # the harness's reward leaves some groups uniform: it resampled


def test_max_num_gen_batches_stops_with_one_line_naming_the_key():
    from rlcore.testing.conformance._step import _Run

    # a reward that is the same for every response: no group is ever informative
    config = DAPO.Config(filter_groups=FilterGroupsConfig(max_num_gen_batches=3))
    run = _Run(lambda: DAPO(config), 4, 2)

    def same_score(batch):
        from rlcore.protocol import DataProto

        return DataProto.from_dict(
            tensors={"token_level_scores": torch.zeros(batch.batch["responses"].shape)},
            non_tensors={"acc": np.array([1.0] * len(batch), dtype=object)},
        ), {}

    ctx_step = run.step
    import rlcore.testing.conformance._step as harness

    original = harness._reward
    harness._reward = same_score
    try:
        with pytest.raises(DynamicSamplingError) as err:
            ctx_step(0)
    finally:
        harness._reward = original
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("algorithm.filter_groups.max_num_gen_batches = 3: 3 generation rounds")


def test_unbounded_resampling_says_how_it_goes(monkeypatch, caplog):
    """max_num_gen_batches = 0 and a reward that does not vary: the step resamples without
    bound, and says so (rounds, groups kept) every PROGRESS_EVERY_S; here every round (0 s),
    four uniform rounds, then the harness's varied reward fills the batch."""
    import logging

    import rlcore.testing.conformance._step as harness
    import rlcore_dapo.algorithm as dapo
    from rlcore.protocol import DataProto
    from rlcore.testing.conformance._step import _Run

    varied, calls = harness._reward, []

    def uniform_then_varied(batch):
        calls.append(len(batch))
        if len(calls) > 4:
            return varied(batch)
        scores = torch.zeros(batch.batch["responses"].shape)
        same = np.array([0.0] * len(batch), dtype=object)
        non_tensors = {"acc": same, "score": same}
        return DataProto.from_dict(
            tensors={"token_level_scores": scores}, non_tensors=non_tensors
        ), {}

    monkeypatch.setattr(harness, "_reward", uniform_then_varied)
    monkeypatch.setattr(dapo, "PROGRESS_EVERY_S", 0.0)
    config = DAPO.Config(
        filter_groups=FilterGroupsConfig(metric="seq_reward", max_num_gen_batches=0)
    )
    with caplog.at_level(logging.INFO, logger="rlcore_dapo"):
        ctx = _Run(lambda: DAPO(config), 4, 2).step(0)
    lines = [r.getMessage() for r in caplog.records if r.name == "rlcore_dapo.algorithm"]
    rounds = int(ctx.metrics["train/num_gen_batches"])
    assert rounds >= 5
    assert len(lines) == rounds - 1  # every round that left the batch short
    assert lines[:4] == [
        f"dapo: still resampling this step: {k} generation round(s), 0 of 4 prompts kept "
        "(their 'seq_reward' differs within the group); "
        "algorithm.filter_groups.max_num_gen_batches = 0 (no bound)"
        for k in (1, 2, 3, 4)
    ]


def test_the_core_never_names_the_plugin():
    """Written only against the public API: no core module imports or names the package."""
    import rlcore

    core = Path(rlcore.__file__).parent
    hits = [
        str(p.relative_to(core))
        for p in core.rglob("*.py")
        if re.search(r"rlcore[_-]dapo", p.read_text(encoding="utf-8"))
    ]
    assert hits == []


@pytest.mark.slow
def test_dapo_on_real_workers_trains_and_a_filter_that_cannot_fill_stops_naming_the_key(
    ray_session, tmp_path
):
    """The tiny run (real Ray workers, FSDP2, HF rollout, GSM8K reward). Its random model
    answers nothing right: every group's ``acc`` is all 0, so the filter can never fill a
    batch, and the run stops with one line naming the key. Without the filter, DAPO (overlong
    shaping, clip-higher) trains two steps."""
    import json

    from rlcore.config import load_config_text
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    model = tiny_run_model(tmp_path / "model")
    rows = arithmetic_rows([(a, b) for a in range(4) for b in range(4)])
    train = write_jsonl(rows, tmp_path / "t.jsonl")

    def config(run: str, options: str):
        text = tiny_run_toml(
            model=model,
            train_files=[train],
            run_dir=tmp_path / run,
            algorithm="dapo",
            algorithm_options=options,
        )
        return load_config_text(text, source=f"{run}.toml")

    stuck = config("stuck", 'filter_groups = { metric = "acc", max_num_gen_batches = 2 }')
    with pytest.raises(DynamicSamplingError) as err:
        run_training(stuck)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(
        "algorithm.filter_groups.max_num_gen_batches = 2: 2 generation rounds gave 0 of 4 "
        "prompts whose 'acc' differs within the group"
    )

    shaped = config(
        "shaped", "filter_groups = { enable = false }\noverlong_buffer = { enable = true, len = 4 }"
    )
    assert run_training(shaped) == 0
    lines = (tmp_path / "shaped" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "train/num_gen_batches" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["train/num_gen_batches"] == 1.0
        assert r["dapo/overlong_penalty/mean"] <= 0.0
        assert "actor/pg_loss" in r
