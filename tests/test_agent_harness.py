"""[agent] harness: agent code behind the endpoint, samples from the recorded tokens, the
token-faithfulness check, splits, and failures that cost one sample (rlcore.agent.harness)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from _agent_harnesses import EditsHistory, Misbehaves, Steps, TwoTurns, UsesEnvironment

from rlcore.agent.harness import HarnessLoop
from rlcore.agent.trajectory import check_row
from rlcore.config import AgentConfig
from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.plugins import Component
from rlcore.protocol import DataProto
from rlcore.rl.step import StepContext, join_generated

R = 64


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("harness"), hidden=64, layers=1, heads=2)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


@pytest.fixture(scope="module")
def rollout(model_path):
    from rlcore_hf.rollout import HFRollout

    class Planting(HFRollout):
        """The real HF rollout, its tokens mapped to letters: a random tiny model writes
        arbitrary bytes, which decode to U+FFFD and re-tokenise differently (the check reports
        those too); here only the planted drift shows. On a first turn whose prompt has a
        "#", a special token lands inside the completion (decoding drops it)."""

        async def generate_one(self, prompt_ids, sampling):
            out = await super().generate_one(prompt_ids, sampling)
            ids = [t if t == EOS else 100 + t % 26 for t in out.token_ids]
            lps = out.log_probs
            if _HASH in prompt_ids and prompt_ids.count(IM_START) == 2:  # the first turn
                ids = [*ids[:1], IM_START, *ids[1:]][: sampling.max_new_tokens]
                lps = None if lps is None else [*lps[:1], 0.0, *lps[1:]][: len(ids)]
            return type(out)(token_ids=ids, log_probs=lps, finish_reason=out.finish_reason)

    return Planting(RolloutSpec(model_path=str(model_path), seed=5))


# build_tiny_model's vocabulary: 0-2 special (1 <|im_start|>, 2 <|im_end|>), then byte b at 3 + b.
IM_START, EOS, _HASH = 1, 2, 3 + ord("#")


def _loop(tokenizer, harness, **config) -> HarnessLoop:
    cfg = AgentConfig(harness="h", harness_isolation=config.pop("isolation", "thread"), **config)
    return HarnessLoop(tokenizer, Component(kind="harness", name="h", target=harness), cfg)


def _prompts(tokenizer, questions: list[str]) -> DataProto:
    raw = [[{"role": "user", "content": q}] for q in questions]
    texts = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in raw
    ]
    enc = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    mask = enc["attention_mask"]
    column = np.empty(len(raw), dtype=object)
    column[:] = raw
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={"raw_prompt": column, "data_source": np.array(["t"] * len(raw), dtype=object)},
    )


def _sampling():
    return SamplingParams(max_new_tokens=R, temperature=1.0, return_log_probs=True)


def _metric(out, name):
    return out.meta_info["metrics"][name][0]


def test_a_harness_history_sent_back_as_it_came_is_one_token_faithful_sample(tokenizer, rollout):
    loop = _loop(tokenizer, TwoTurns)
    loop.weight_version = 3  # what the rollout worker sets before each generate
    out = loop.generate(
        rollout, _prompts(tokenizer, ["What is 1 + 2?", "What is 3 + 4?"]), _sampling()
    )
    assert len(out) == 2
    assert _metric(out, "agent/splits") == 0
    assert _metric(out, "agent/retokenize_mismatch") == 0
    assert _metric(out, "agent/calls") == 2
    for row in range(2):
        summary = out.non_tensor_batch["agent"][row]
        assert summary["x"] == 1  # the harness's reward inputs reach extra_info
        assert summary["turns"][-1]["role"] == "assistant"
        assert summary["weight_versions"] == [3, 3]  # each call's answering version
        # The row is the recorded tokens, the loss on the model's tokens only.
        prompt = out.batch["prompts"][row][out.batch["attention_mask"][row, :-R].bool()]
        n = int(out.batch["attention_mask"][row, -R:].sum())
        why = check_row(
            loop.last_samples[row], out.batch["responses"][row, :n].tolist(),
            out.batch["response_mask"][row, :n].tolist(), prompt.tolist(),
        )  # fmt: skip
        assert why is None
        assert 0 < out.batch["response_mask"][row].sum() < n  # the tool turn is not trained
    loop.server.stop()


def test_planted_retokenisation_drift_is_counted_and_edited_history_splits(tokenizer, rollout):
    loop = _loop(tokenizer, TwoTurns)
    questions = ["# What is 1 + 2?", "What is 3 + 4?", "# What is 5 + 6?", "What is 7 + 8?"]
    out = loop.generate(rollout, _prompts(tokenizer, questions), _sampling())
    # Two rows planted a token the re-sent text loses: each is reported, and its next
    # prompt no longer extends the recorded tokens, so it split.
    assert _metric(out, "agent/retokenize_mismatch") == 2
    assert _metric(out, "agent/splits") == 2
    assert list(out.non_tensor_batch["agent_row"]) == [0, 0, 1, 2, 2, 3]
    positions = [s["retokenize_position"] for s in out.non_tensor_batch["agent"]]
    assert positions[0] is not None
    assert positions[1] is None
    assert positions[2] is None

    edits = _loop(tokenizer, EditsHistory)
    batch = _prompts(tokenizer, ["What is 1 + 2?", "What is 3 + 4?"])
    batch.non_tensor_batch["uid"] = np.array(["a", "b"], dtype=object)
    prompts = StepContext.prompts(batch)  # as the driver sends them: the task rides along
    assert "raw_prompt" in prompts.non_tensor_batch
    out = edits.generate(rollout, prompts, _sampling())
    assert _metric(out, "agent/splits") == 2
    joined = join_generated(batch, out)  # the batch repeats each row for its samples
    assert list(joined.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    # Both samples of a trajectory carry loss on their own completion tokens, and GRPO's
    # policy loss sends gradient to every one of them (and to nothing else).
    assert (joined.batch["response_mask"].sum(-1) > 0).all()
    _assert_every_row_trains(rollout.model, joined)
    loop.server.stop()
    edits.server.stop()


def _assert_every_row_trains(model, batch: DataProto) -> None:
    import torch

    from rlcore.interfaces import BatchTotals, ModelOutputs
    from rlcore_grpo.algorithm import GRPO

    mask = batch.batch["response_mask"]
    logits = model(
        input_ids=batch.batch["input_ids"],
        attention_mask=batch.batch["attention_mask"],
        position_ids=batch.batch["position_ids"],
    ).logits[:, -R - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.batch["responses"].unsqueeze(-1))
    logp = logp.squeeze(-1).detach().requires_grad_(True)
    loss_in = DataProto.from_dict(
        tensors={"response_mask": mask, "old_log_probs": logp.detach(),
                 "advantages": torch.ones_like(logp)},
    )  # fmt: skip
    totals = BatchTotals(tokens=int(mask.sum()), sequences=len(batch), max_response_length=R)
    loss, _ = GRPO().policy_loss(ModelOutputs(log_probs=logp), loss_in, totals)
    loss.backward()
    assert (logp.grad.abs().sum(-1) > 0).all()
    assert torch.all(logp.grad[mask == 0] == 0)


def test_failures_cost_only_their_own_sample(tokenizer, rollout, caplog):
    # 6 s: the well-behaved rows finish well within it on a loaded machine.
    loop = _loop(tokenizer, Misbehaves, harness_timeout_s=6.0, max_calls_per_sample=2)
    with caplog.at_level(logging.WARNING):
        out = loop.generate(rollout, _prompts(tokenizer, [f"q{i}" for i in range(5)]), _sampling())
    assert len(out) == 5
    failures = [s["harness_failure"] for s in out.non_tensor_batch["agent"]]
    assert failures == [None, "timeout", "crash", "empty", "flood"]
    mask = out.batch["response_mask"].sum(-1).tolist()
    assert mask[0] > 0
    assert mask[1:] == [0, 0, 0, 0]
    assert _metric(out, "agent/harness_failures") == 4
    assert _metric(out, "agent/harness_timeouts") == 1
    assert _metric(out, "agent/endpoint_refused") == 4
    lines = [r.getMessage() for r in caplog.records if "harness 'h'" in r.getMessage()]
    assert any("returned nothing" in line for line in lines)
    loop.server.stop()


def test_a_harness_in_a_child_process_is_bounded(tokenizer, rollout):
    loop = _loop(tokenizer, Misbehaves, isolation="process", harness_timeout_s=8.0)
    out = loop.generate(rollout, _prompts(tokenizer, ["q0", "q1", "q2"]), _sampling())
    failures = [s["harness_failure"] for s in out.non_tensor_batch["agent"]]
    assert failures == [None, "timeout", "crash"]
    assert out.batch["response_mask"][0].sum() > 0
    loop.server.stop()


def test_an_environment_is_stepped_and_one_that_raises_ends_its_sample(tokenizer, rollout, caplog):
    cfg = AgentConfig(harness="h", environment="steps", harness_isolation="thread")
    loop = HarnessLoop(
        tokenizer,
        Component(kind="harness", name="h", target=UsesEnvironment),
        cfg,
        Component(kind="environment", name="steps", target=Steps),
    )
    with caplog.at_level(logging.WARNING):
        out = loop.generate(rollout, _prompts(tokenizer, ["a", "b"]), _sampling())
    agent = out.non_tensor_batch["agent"]
    # Row 0's two calls have unrelated prompts ("go", "ok"): two samples, one reward.
    assert list(out.non_tensor_batch["agent_row"]) == [0, 0, 1]
    assert [a.get("env_reward") for a in agent[:2]] == [2.0, 2.0]
    assert agent[2]["harness_failure"] == "env"
    assert _metric(out, "agent/env_errors") == 1
    assert any(
        "environment 'steps' step raised RuntimeError" in r.getMessage() for r in caplog.records
    )
    loop.server.stop()


def _toml(tmp_path, agent: str) -> str:
    from rlcore.testing.runs import tiny_run_toml

    return tiny_run_toml(
        model=tmp_path, train_files=[tmp_path / "t.jsonl"], run_dir=tmp_path / "run", extra=agent
    )


def test_the_harness_and_its_options_come_from_the_toml_and_a_missing_one_is_one_line(
    tmp_path, model_path
):
    import attrs

    from rlcore.config import ConfigValidationError, load_config_text
    from rlcore.roles.policy import _build_agent_loop
    from rlcore.trainer.specs import _agent_spec
    from rlcore_calculator.harness import OpenAICalculatorHarness

    agent = (
        '[agent]\nharness = "openai_calculator"\n[agent.options.openai_calculator]\nmax_turns = 3\n'
    )
    config = load_config_text(_toml(tmp_path, agent), source="a.toml")
    spec = _agent_spec(config, None)
    assert spec.harness.options == OpenAICalculatorHarness.Config(max_turns=3)
    loop = _build_agent_loop(attrs.evolve(spec, tokenizer_path=str(model_path)))
    assert isinstance(loop, HarnessLoop)
    assert loop.harness_cls is OpenAICalculatorHarness

    with pytest.raises(ConfigValidationError) as info:
        load_config_text(_toml(tmp_path, '[agent]\nharness = "nope"\n'), source="a.toml")
    message = str(info.value)
    assert "agent.harness" in message
    assert "harness 'nope'" in message
    assert "\n" not in message.strip()


def test_conformance_of_harnesses_and_of_the_hf_rollout_behind_the_endpoint(
    tokenizer, rollout, model_path
):
    from rlcore.testing.conformance import check_harness, check_rollout_endpoint
    from rlcore_calculator.harness import OpenAICalculatorHarness
    from rlcore_hf.rollout import HFRollout

    chats = [[{"role": "user", "content": "What is 1 + 2?"}], [{"role": "user", "content": "Hi"}]]
    report = check_harness(TwoTurns, rollout, tokenizer, chats)
    assert (report.samples, report.splits, report.retokenize_mismatch) == (2, 0, 0)
    assert report.calls == 2
    check_harness(OpenAICalculatorHarness, rollout, tokenizer, chats)
    with pytest.raises(AssertionError, match="no split"):
        check_harness(EditsHistory, rollout, tokenizer, chats)
    check_rollout_endpoint(HFRollout(RolloutSpec(model_path=str(model_path), seed=2)), tokenizer)


def test_the_built_in_loop_steps_an_environment_and_one_that_raises_costs_its_sample(
    tokenizer, rollout, caplog
):
    from rlcore.agent.harness import GuardedEnvironment
    from rlcore.agent.loop import AgentLoop

    loop = AgentLoop(
        tokenizer, [], AgentConfig(max_turns=3, max_tokens_per_turn=4),
        environment=lambda: GuardedEnvironment(Steps(), "steps"),
    )  # fmt: skip
    prompts = StepContext.prompts(_prompts(tokenizer, ["a", "b"]))
    with caplog.at_level(logging.WARNING):
        out = loop.generate(rollout, prompts, _sampling())
    agent = out.non_tensor_batch["agent"]
    assert agent[0]["env_reward"] == 2.0
    assert agent[0]["num_turns"] == 2  # the environment ended the episode at its 2nd step
    assert out.batch["response_mask"][0].sum() > 0
    assert out.batch["response_mask"][1].sum() == 0  # its environment raised: no gradient
    assert _metric(out, "agent/env_errors") == 1
    assert any("environment 'steps' step raised" in r.getMessage() for r in caplog.records)
