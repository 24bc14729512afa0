"""ReMax: verl's formula on hand-made tensors, the step-program conformance rules, the greedy
baseline on the conformance harness, and a tiny real run (Ray workers, FSDP2, HF rollout)
whose trained rows' advantages are their reward minus their prompt's greedy reward."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.hookspecs import hookimpl
from rlcore.interfaces import CONTRACT_VERSION, AlgorithmNeeds, BaseReward, SamplingParams
from rlcore.testing.conformance import (
    check_algorithm,
    check_contract,
    check_plugin_module,
    check_signatures,
    check_step_program,
)
from rlcore_remax.algorithm import (
    ReMax,
    ReMaxProgram,
    compute_remax_outcome_advantage,
    greedy_sampling,
)


def _remax(**options):
    return ReMax(ReMax.Config(**options))


def _verl(token_level_rewards, reward_baselines, response_mask):
    # verl/trainer/ppo/core_algos.py compute_remax_outcome_advantage, verbatim
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


def test_plugin_module():
    assert check_plugin_module("rlcore_remax.plugin") == {
        "algorithm/remax": "rlcore_remax.algorithm:ReMax"
    }
    assert check_contract("rlcore_remax.plugin") == CONTRACT_VERSION
    check_signatures(ReMax)


def test_needs_no_critic_and_its_zero_advantage_rows_are_inert():
    assert _remax().needs == AlgorithmNeeds(
        old_log_probs_on_driver=False, zero_advantage_rows_inert=True
    )
    assert _remax(use_kl_in_reward=True).needs.reference


class _Baselined(ReMax):
    """ReMax on check_algorithm's batch, which has no greedy rewards: a baseline per uid
    (as the program gives: one per prompt) is added with the rewards."""

    def compute_rewards(self, batch):
        batch, metrics = super().compute_rewards(batch)
        if "reward_baselines" not in batch.batch:
            by_uid = {"a": 0.25, "b": 1.25, "c": 0.0, "d": -0.5}
            uids = batch.non_tensor_batch["uid"]
            batch.batch["reward_baselines"] = torch.tensor(
                [by_uid[u] for u in uids], dtype=torch.float64
            )
        return batch, metrics


@pytest.mark.parametrize(
    "options", [{}, {"use_kl_loss": True}, {"use_kl_in_reward": True}, {"policy_loss": "gspo"}]
)
def test_algorithm_conformance(options):
    check_algorithm(_Baselined, ReMax.Config(**options))


def test_the_advantage_is_verls_formula():
    # outcome scores on the last valid token, a token-level (KL-shaped) row, an empty row
    mask = torch.tensor(
        [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.int64
    )
    rewards = torch.tensor(
        [
            [0.0, 0.0, 1.0, 0.0],
            [0.0, 0.0, 0.0, 0.5],
            [2.0, 0.0, 0.0, 0.0],
            [-0.1, 0.2, -0.3, 1.0],
            [0.0, 0.0, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    baselines = torch.tensor([0.25, 1.0, 2.0, 0.5, 3.0], dtype=torch.float64)
    adv, ret = compute_remax_outcome_advantage(rewards, baselines, mask)
    want_adv, want_ret = _verl(rewards, baselines, mask)
    torch.testing.assert_close(adv, want_adv, rtol=0, atol=0)
    torch.testing.assert_close(ret, want_ret, rtol=0, atol=0)
    # the numbers, by hand: every valid token of an outcome-scored row gets r - r(greedy)
    assert adv[0].tolist() == [0.75, 0.75, 0.75, 0.0]
    assert adv[1].tolist() == [-0.5, -0.5, -0.5, -0.5]
    assert adv[2].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[3].tolist() == pytest.approx([0.3, 0.4, 0.2, 0.5])
    assert adv[4].tolist() == [0.0] * 4  # a response cut to nothing: no advantage, no baseline
    assert ret[3].tolist() == pytest.approx([0.8, 0.9, 0.7, 1.0])


def test_a_nan_under_the_mask_stays_out():
    mask = torch.tensor([[1, 1, 0]])
    rewards = torch.tensor([[0.0, 1.0, float("nan")]])
    adv, ret = compute_remax_outcome_advantage(rewards, torch.tensor([0.5]), mask)
    assert adv.tolist() == [[0.5, 0.5, 0.0]]
    assert ret.tolist() == [[1.0, 1.0, 0.0]]


def test_compute_advantages_reads_the_batchs_baselines():
    from rlcore.protocol import DataProto

    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    batch = DataProto.from_dict(
        tensors={
            "response_mask": mask,
            "token_level_scores": scores,
            "reward_baselines": torch.tensor([0.25, 0.25]),
        },
        non_tensors={"uid": np.array(["a", "a"], dtype=object)},
    )
    algo = _remax()
    batch, _ = algo.compute_rewards(batch)
    out = algo.compute_advantages(batch)
    assert out.batch["advantages"].tolist() == [[0.75, 0.75, 0.0], [-0.25, -0.25, -0.25]]
    del out.batch["reward_baselines"]
    with pytest.raises(KeyError, match="reward_baselines"):
        algo.compute_advantages(out)


def test_greedy_sampling_keeps_the_budget_and_turns_sampling_off():
    train = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33, return_log_probs=True
    )
    greedy = greedy_sampling(train)
    assert greedy == SamplingParams(
        temperature=0.0, top_p=1.0, top_k=-1, max_new_tokens=33, do_sample=False
    )


def test_the_config_is_verls_estimator_name_and_nothing_else():
    assert ReMax.Config().adv_estimator == "remax"
    assert not _remax().needs.critic
    with pytest.raises(ValueError, match="ReMax computes its own advantages"):
        ReMax.Config(adv_estimator="grpo")


@pytest.mark.parametrize(
    "options", [{}, {"use_kl_loss": True}, {"use_kl_in_reward": True}, {"entropy_coeff": 0.01}]
)
def test_step_program_conformance(options):
    check_step_program(lambda: _remax(**options))
    check_step_program(lambda: _remax(**options), batch_size=3, n=1)


def test_the_greedy_rows_are_the_baseline_and_are_not_trained_on():
    """On the conformance harness: one greedy call per step on the un-repeated prompts with
    greedy sampling, its reward repeated to the n rows, advantages = reward - baseline."""
    from rlcore.testing.conformance import _step as harness

    calls: list[tuple[int, SamplingParams]] = []

    class Recording(harness._Group):
        def generate_sequences(self, prompts, sampling):
            calls.append((len(prompts), sampling))
            return super().generate_sequences(prompts, sampling)

    greedy_rewards: list[torch.Tensor] = []

    class Program(ReMaxProgram):
        def baseline(self, ctx, prompts):
            out = super().baseline(ctx, prompts)
            greedy_rewards.append(out.clone())
            return out

    algo = _remax()
    algo.step_program = Program  # type: ignore[method-assign]
    run = harness._Run(lambda: algo, batch_size=4, n=3)
    run.policy = Recording()
    for step in range(2):
        calls.clear()
        ctx = run.step(step)
        assert ctx.phases[:3] == ["gen_greedy", "reward_greedy", "gen"]
        assert ctx.phases[-2:] == ["adv", "update_actor"]
        (greedy_rows, greedy), (sampled_rows, sampled) = calls
        assert (greedy_rows, sampled_rows) == (4, 12)
        assert not greedy.do_sample
        assert greedy.temperature == 0.0
        assert sampled.do_sample
        trained = run.policy.updates[-1]
        assert len(trained) == 12  # the 4 greedy rows are not among them
        baselines = trained.batch["reward_baselines"]
        assert torch.equal(baselines, greedy_rewards[-1].repeat_interleave(3))
        mask = trained.batch["response_mask"].bool()
        score = trained.batch["token_level_scores"].sum(-1)
        for row in range(len(trained)):
            adv = trained.batch["advantages"][row]
            assert torch.all(adv[mask[row]] == score[row] - baselines[row])
            assert torch.all(adv[~mask[row]] == 0)
        gap = (score - baselines).float()
        assert ctx.metrics["remax/sample_minus_baseline_mean"] == pytest.approx(float(gap.mean()))
        assert ctx.metrics["remax/baseline_reward_mean"] == pytest.approx(
            float(greedy_rewards[-1].float().mean())
        )
        assert "remax/greedy_response_length_mean" in ctx.metrics
        assert "remax/greedy/mean" in ctx.metrics  # the harness reward's "reward/mean"
        assert ctx.metrics["reward/mean"] == pytest.approx(float((score > 0).float().mean()))


def test_the_core_never_names_the_plugin():
    """Written only against the public API: no core module imports or names the package."""
    import rlcore

    core = Path(rlcore.__file__).parent
    hits = [
        str(p.relative_to(core))
        for p in core.rglob("*.py")
        if re.search(r"rlcore[_-]remax", p.read_text(encoding="utf-8"))
    ]
    assert hits == []


# --- a tiny real run: Ray workers, FSDP2, HF rollout ------------------------------------------


class LengthReward(BaseReward):
    """Scores the decoded response's length modulo 3 (0, 0.5 or 1): greedy and sampled
    responses of the tiny random model score differently, so the advantages are not all 0
    (the GSM8K reward would score this model 0 everywhere)."""

    def score(self, data_source, solution_str, ground_truth, extra_info=None):
        return (len(solution_str) % 3) / 2


class LengthRewardPlugin:
    contract_version = CONTRACT_VERSION

    @staticmethod
    @hookimpl
    def register_rewards():
        return {"length_mod3": LengthReward}


@pytest.mark.slow
def test_a_tiny_run_trains_on_sample_minus_greedy_reward(ray_session, tmp_path, monkeypatch):
    """``run_training`` on the installed plugin (the driver runs in this process, so its step
    program can be watched): the greedy phases ran and were timed, every trained row's
    advantage is its reward minus its prompt's greedy reward, the actor trained."""
    from rlcore.config import load_config_text
    from rlcore.plugins import PluginRegistry
    from rlcore.testing.runs import arithmetic_rows, tiny_run_model, tiny_run_toml, write_jsonl
    from rlcore.trainer import run_training

    trained: list = []
    baselines: list[torch.Tensor] = []

    class Watched(ReMaxProgram):
        def baseline(self, ctx, prompts):
            out = super().baseline(ctx, prompts)
            baselines.append(out.clone())
            return out

        def run(self, ctx, batch):
            out = super().run(ctx, batch)
            trained.append(out)
            return out

    monkeypatch.setattr(ReMax, "step_program", lambda self: Watched())
    registry = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    registry.register(LengthRewardPlugin(), name="length-reward-test")

    model = tiny_run_model(tmp_path / "model")
    rows = arithmetic_rows([(a, b) for a in range(4) for b in range(4)])
    text = tiny_run_toml(
        model=model,
        train_files=[write_jsonl(rows, tmp_path / "t.jsonl")],
        run_dir=tmp_path / "run",
        algorithm="remax",
        n=2,
    ).replace('default = ["gsm8k"]', 'default = ["length_mod3"]\nnum_workers = 1')
    config = load_config_text(text, source="remax.toml", registry=registry)
    assert run_training(config, registry=registry) == 0

    assert len(trained) == len(baselines) == 2
    nonzero = 0
    for batch, greedy in zip(trained, baselines, strict=True):
        assert len(greedy) == 4  # one greedy response per prompt
        assert len(batch) == 8  # 4 prompts x n = 2: the greedy rows are not trained on
        assert torch.equal(batch.batch["reward_baselines"], greedy.repeat_interleave(2))
        mask = batch.batch["response_mask"].bool()
        score = batch.batch["token_level_scores"].sum(-1)
        for row in range(len(batch)):
            adv = batch.batch["advantages"][row]
            want = score[row] - batch.batch["reward_baselines"][row]
            assert torch.allclose(adv[mask[row]], want.expand(int(mask[row].sum())))
            assert torch.all(adv[~mask[row]] == 0)
            nonzero += int(want != 0)
    assert nonzero > 0, "every sample scored like its greedy response: a trivial check"

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "timing_s/gen_greedy" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r, greedy in zip(steps, baselines, strict=True):
        assert r["timing_s/gen_greedy"] > 0
        assert "timing_s/reward_greedy" in r
        assert r["remax/baseline_reward_mean"] == pytest.approx(float(greedy.mean()))
        assert "remax/sample_minus_baseline_mean" in r
        assert "actor/pg_loss" in r
        assert np.isfinite(r["actor/grad_norm"])
