"""The judge's role on its own: a real worker group (``GenerationRoleWorker``, HF rollout on
the tiny model) called by the reward, in batches, and a call past ``timeout_s`` stopping with
an error that names the role and the limit."""

from __future__ import annotations

import json

import pytest


def _batch(prompts, responses, truths):
    import torch

    from rlcore.interfaces import RewardBatch
    from rlcore.protocol import DataProto

    n = len(prompts)
    ones = torch.ones(n, 2)
    return RewardBatch(
        prompts=tuple(prompts),
        responses=tuple(responses),
        prompt_ids=ones.long(),
        response_ids=ones.long(),
        attention_mask=torch.ones(n, 4).long(),
        response_mask=ones,
        data_sources=("arithmetic",) * n,
        ground_truths=tuple(truths),
        extra_infos=(None,) * n,
        data=DataProto.from_dict(tensors={"responses": ones.long()}),
    )


@pytest.fixture(scope="module")
def judge_role(ray_session, tmp_path_factory):
    """The role's worker group (one process) on the tiny model, and the model's folder."""
    from rlcore.config import load_config_text
    from rlcore.roles.generation_roles import GenerationRoleWorker
    from rlcore.testing.runs import tiny_run_model, tiny_run_toml
    from rlcore.trainer.specs import build_generation_role_specs, worker_settings
    from rlcore.workers import ClassWithInitArgs, RayWorkerGroup
    from rlcore.workers.resources import ResourcePool
    from rlcore_judge.reward import JudgeReward

    tmp = tmp_path_factory.mktemp("judge_role")
    model = tiny_run_model(tmp / "model")
    (tmp / "t.jsonl").write_text("")
    options = f"[reward.options.judge]\nmodel_path = {json.dumps(str(model))}\n"
    text = tiny_run_toml(
        model=model, train_files=[tmp / "t.jsonl"], run_dir=tmp / "run", extra=options
    )
    config = load_config_text(text, source="role.toml")
    reward = JudgeReward(JudgeReward.Config(model_path=str(model), max_new_tokens=4))
    (spec,) = build_generation_role_specs(
        config, reward.roles, settings=worker_settings(config)
    ).values()
    pool = ResourcePool(nnodes=1, processes_per_node=1, use_gpu=False, name="judge-role-test")
    group = RayWorkerGroup(pool, ClassWithInitArgs(GenerationRoleWorker, spec), role="judge")
    try:
        group.init_model()
        yield group, model
    finally:
        group.shutdown()
        pool.remove()


@pytest.mark.slow
def test_the_role_judges_in_batches_with_the_same_frozen_model(judge_role):
    from rlcore_judge.reward import JudgeReward

    group, model = judge_role
    reward = JudgeReward(
        JudgeReward.Config(model_path=str(model), max_new_tokens=4, batch_size=2, timeout_s=60)
    )
    reward.bind_roles({"judge": group})
    batch = _batch(["What is 1 + 2?"] * 5, ["3", "4", "#### 3", "", "x"], ["3"] * 5)
    first = reward.score_batch(batch)
    assert first.scores.shape == (5,)
    assert first.metrics["calls"] == 3  # 2 + 2 + 1
    assert first.metrics["unparseable"] + sum(first.extras["judge_parsed"]) == 5
    assert first.metrics["response_tokens_mean"] <= 4
    # Greedy and frozen: the same prompts get the same judgements.
    again = reward.score_batch(batch)
    assert again.scores.tolist() == first.scores.tolist()
    assert again.extras["judge_parsed"] == first.extras["judge_parsed"]
    # The role has no weight sync: nothing but generate_text and init_model is callable.
    assert sorted(group.method_names) == ["generate_text", "init_model"]


@pytest.mark.slow
def test_a_call_past_the_timeout_names_the_role_and_the_limit(judge_role):
    from rlcore.errors import RewardError
    from rlcore_judge.reward import JudgeReward

    group, model = judge_role
    reward = JudgeReward(
        JudgeReward.Config(model_path=str(model), max_new_tokens=64, timeout_s=0.001)
    )
    reward.bind_roles({"judge": group})
    with pytest.raises(RewardError) as info:
        reward.score_batch(_batch(["q"] * 3, ["a"] * 3, ["1"] * 3))
    assert str(info.value) == (
        "judge role 'judge' did not answer 3 prompts within reward.options.judge.timeout_s = "
        "0.001 s; raise it, lower batch_size or max_new_tokens"
    )


def test_an_unbound_judge_says_so(tmp_path):
    from rlcore.errors import RewardError
    from rlcore.testing.runs import tiny_run_model
    from rlcore_judge.reward import JudgeReward

    reward = JudgeReward(JudgeReward.Config(model_path=str(tiny_run_model(tmp_path / "m"))))
    (role,) = reward.roles
    assert (role.name, role.rollout, role.max_response_length) == ("judge", "hf", 64)
    with pytest.raises(RewardError, match="role 'judge' is not bound"):
        reward.score_batch(_batch(["q"], ["a"], ["1"]))


def test_the_prompt_placeholder_is_the_question_not_the_chat_text(tmp_path):
    import attrs
    import numpy as np

    from rlcore.protocol import DataProto
    from rlcore.reward import RewardManager
    from rlcore.testing.runs import tiny_run_model
    from rlcore_judge.reward import JudgeReward

    reward = JudgeReward(
        JudgeReward.Config(
            model_path=str(tiny_run_model(tmp_path / "m")), template="Q={prompt} A={response}"
        )
    )
    batch = _batch(["user\nWhat is 1 + 2?\nassistant\n"] * 3, ["3", "4", "5"], ["3"] * 3)
    raw = np.empty(3, dtype=object)
    raw[:] = [
        [{"role": "system", "content": "Brief."}, {"role": "user", "content": "What is 1 + 2?"}],
        "plain text prompt",
        None,  # none: the decoded prompt
    ]
    batch = attrs.evolve(batch, data=DataProto.from_dict(non_tensors={"raw_prompt": raw}))
    assert reward.prompts(batch) == [
        "Q=What is 1 + 2? A=3",
        "Q=plain text prompt A=4",
        "Q=user\nWhat is 1 + 2?\nassistant\n A=5",
    ]
    # The manager collects the roles its scorers declare and refuses a role left unplaced.
    manager = RewardManager(None, {"judge": reward}, default=["judge"], num_workers=1)
    assert [r.name for r in manager.roles()] == ["judge"]
    with pytest.raises(Exception, match=r"reward 'judge': its roles \['judge'\] were not placed"):
        manager.bind_roles({})
