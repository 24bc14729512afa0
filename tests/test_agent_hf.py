"""The agent loop on the real HF rollout and the tiny model; tool tokens get no gradient."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _agent_hf_tools import EchoTool  # importable by the tool's processes

from rlcore.agent.loop import AgentLoop
from rlcore.agent.parsers import HermesToolParser, ToolCall
from rlcore.config import AgentConfig
from rlcore.interfaces import GenerationResult, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("agent_hf"), hidden=64, layers=1, heads=2)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


class FirstTurnCalls(HermesToolParser):
    """A random tiny model never writes a tool call: treat its first turn as one."""

    def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
        return [ToolCall(name="echo", arguments={})], []


def _recording_rollout(model_path):
    from rlcore_hf.rollout import HFRollout

    class Recording(HFRollout):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.results: list[tuple[list[int], GenerationResult]] = []
            self.in_flight = self.max_in_flight = 0

        async def generate_one(self, prompt_ids, sampling):
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                result = await super().generate_one(prompt_ids, sampling)
            finally:
                self.in_flight -= 1
            self.results.append((list(prompt_ids), result))
            return result

    return Recording(RolloutSpec(model_path=str(model_path), seed=3))


def _prompts(tok, n: int) -> DataProto:
    texts = [
        f"<|im_start|>user\nWhat is {i} + {i}?<|im_end|>\n<|im_start|>assistant\n" for i in range(n)
    ]
    enc = tok(texts, padding=True, padding_side="left", return_tensors="pt")
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


def test_many_conversations_in_flight_on_the_hf_rollout_keep_model_tokens(model_path, tokenizer):
    rollout = _recording_rollout(model_path)
    loop = AgentLoop(
        tokenizer, [EchoTool()], AgentConfig(tools=("echo",), max_turns=2, max_tokens_per_turn=12)
    )
    loop.parser = FirstTurnCalls()
    prompts = _prompts(tokenizer, 8)
    sampling = SamplingParams(max_new_tokens=120, temperature=1.0, return_log_probs=True)
    out = loop.generate(rollout, prompts, sampling)

    assert rollout.max_in_flight > 1  # requests overlapped
    assert len(rollout.results) == 16  # 8 conversations x 2 model turns
    tool_ids = tokenizer.encode(loop.parser.format_responses(["42"]), add_special_tokens=False)
    by_prompt = {tuple(p): r for p, r in rollout.results}
    P = prompts.batch["input_ids"].shape[1]
    mask_in = prompts.batch["attention_mask"].bool()
    for row in range(8):
        prompt = prompts.batch["input_ids"][row][mask_in[row]].tolist()
        first = by_prompt[tuple(prompt)]
        # The second request is the conversation so far, ids untouched (no re-encoding).
        second = by_prompt[tuple(prompt + first.token_ids + tool_ids)]
        n1, n2, nt = len(first.token_ids), len(second.token_ids), len(tool_ids)
        resp = out.batch["responses"][row].tolist()
        mask = out.batch["response_mask"][row].tolist()
        assert resp[: n1 + nt + n2] == first.token_ids + tool_ids + second.token_ids
        assert mask[: n1 + nt + n2] == [1] * n1 + [0] * nt + [1] * n2
        assert sum(mask) == n1 + n2
        lp = out.batch["rollout_log_probs"][row].tolist()
        assert lp[:n1] == pytest.approx(first.log_probs)
        assert lp[n1 + nt : n1 + nt + n2] == pytest.approx(second.log_probs)
        # The full sequence the trainer scores is prompt + every turn, padding at the end.
        assert out.batch["input_ids"][row, P:].tolist() == resp
        assert out.non_tensor_batch["agent"][row]["num_turns"] == 2
    assert out.meta_info["metrics"]["agent/tool_calls"][0] > 0


def test_tool_tokens_get_no_gradient(model_path, tokenizer):
    """GRPO's policy loss on an agent batch: d loss / d log p is 0 on tool tokens, and
    parameter gradients do not change when the advantages of tool tokens do."""
    from transformers import AutoModelForCausalLM

    from rlcore.interfaces import BatchTotals, ModelOutputs
    from rlcore_grpo.algorithm import GRPO

    rollout = _recording_rollout(model_path)
    loop = AgentLoop(
        tokenizer, [EchoTool()], AgentConfig(tools=("echo",), max_turns=2, max_tokens_per_turn=12)
    )
    loop.parser = FirstTurnCalls()
    sampling = SamplingParams(max_new_tokens=48, temperature=1.0)
    out = loop.generate(rollout, _prompts(tokenizer, 4), sampling)
    mask = out.batch["response_mask"].float()
    seen = out.batch["attention_mask"][:, -48:].float()
    tool = (seen - mask).bool()  # tool and template tokens
    assert tool.any()
    assert mask.bool().any()

    model = AutoModelForCausalLM.from_pretrained(model_path).float()
    algo = GRPO()
    totals = BatchTotals(
        tokens=int(mask.sum()), sequences=int((mask.sum(-1) > 0).sum()), max_response_length=48
    )

    def grads(advantages: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits[:, -49:-1]  # (B, R, V): the logits that predict each response token
        logp = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"].unsqueeze(-1))
        logp = logp.squeeze(-1)
        logp.retain_grad()
        batch = DataProto.from_dict(
            tensors={
                "response_mask": out.batch["response_mask"],
                "old_log_probs": logp.detach(),
                "advantages": advantages,
            }
        )
        loss, _ = algo.policy_loss(ModelOutputs(log_probs=logp), batch, totals)
        loss.backward()
        return logp.grad.clone(), [p.grad.clone() for p in model.parameters()]

    adv = torch.randn(4, 48, generator=torch.Generator().manual_seed(0))
    g_logp, g_params = grads(adv)
    assert torch.all(g_logp[tool] == 0)
    assert torch.all(g_logp[mask.bool()] != 0)
    # Huge advantages on tool tokens only: the parameter gradient is exactly the same.
    g2_logp, g2_params = grads(torch.where(tool, adv * 1e6, adv))
    assert torch.equal(g_logp, g2_logp)
    assert all(torch.equal(a, b) for a, b in zip(g_params, g2_params))
