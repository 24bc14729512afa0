"""The async engine (``async_engine = true``: vLLM's AsyncLLM): per-request ``generate_one``
with many requests in the engine at once, the agent loop with the calculator tool on it, and
the batch face, weight sync and greedy parity with the HF rollout on the same engine.

One AsyncLLM for the module (its EngineCore subprocess takes ~20 s to start here).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from rlcore.interfaces import BaseHarness, RolloutSpec, SamplingParams

pytestmark = pytest.mark.usefixtures("need_vllm")

KV_GB = 0.0625
R = 24


@pytest.fixture(scope="module")
def spec(model_path):
    # Room for agent conversations: the tiny tokenizer spells a tool turn in ~90 tokens.
    return RolloutSpec(model_path=model_path, max_prompt_length=64, max_response_length=256, seed=7)


@pytest.fixture(scope="module")
def rollout(spec):
    from rlcore_vllm.rollout import VLLMRollout

    config = VLLMRollout.Config(kv_cache_space_gb=KV_GB, async_engine=True, max_num_seqs=16)
    rollout = VLLMRollout(spec, config)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def prompts(model_path, make_prompts, texts):
    return make_prompts(model_path, texts)


def _rows(prompts) -> list[list[int]]:
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    return [ids[i][mask[i]].tolist() for i in range(len(ids))]


def _run(coro):
    """On a new event loop each time, as the agent loop does per batch."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def _with_engine_load(rollout, coro):
    """Run ``coro`` while sampling how many requests the engine holds unfinished."""
    seen: list[int] = []
    task = asyncio.ensure_future(coro)
    while not task.done():
        seen.append(rollout.llm.engine.get_num_unfinished_requests())
        await asyncio.sleep(0.002)
    return await task, max(seen, default=0)


def test_batch_on_the_async_engine_equals_the_hf_rollout_greedy(rollout, spec, prompts):
    from rlcore_hf.rollout import HFRollout

    assert not rollout.in_process
    greedy = SamplingParams(do_sample=False, max_new_tokens=R)
    ours = rollout.generate(prompts, greedy)
    ref = HFRollout(spec).generate(prompts, greedy)
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(ours.batch[key], ref.batch[key]), key


def test_generate_one_interleaves_requests_and_equals_the_batch_greedy(rollout, prompts):
    greedy = SamplingParams(do_sample=False, max_new_tokens=R, return_log_probs=True)
    batch = rollout.generate(prompts, greedy)
    rows = _rows(prompts)

    async def all_rows():
        return await asyncio.gather(*(rollout.generate_one(r, greedy) for r in rows))

    results, most = _run(_with_engine_load(rollout, all_rows()))
    assert most > 1, "generate_one requests never overlapped in the engine"
    for i, result in enumerate(results):
        n = int(batch.batch["response_mask"][i].sum())
        assert result.token_ids == batch.batch["responses"][i, :n].tolist(), i
        assert result.finish_reason == ("length" if n == R else "stop")
        assert result.log_probs == pytest.approx(
            batch.batch["rollout_log_probs"][i, :n].tolist(), abs=1e-4
        )
    print(f"\n64 generate_one requests, up to {most} unfinished in the engine at once")


def test_a_caller_that_stops_waiting_aborts_its_request(rollout, prompts):
    row = _rows(prompts)[0]
    long = SamplingParams(temperature=1.0, max_new_tokens=R)

    async def impatient():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(rollout.generate_one(row, long), timeout=0.001)
        for _ in range(500):  # the abort crosses to the engine loop, then to EngineCore
            if rollout.llm.engine.get_num_unfinished_requests() == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    assert _run(impatient())
    # The engine still serves requests afterwards.
    assert _run(rollout.generate_one(row, SamplingParams(do_sample=False, max_new_tokens=4)))


def test_update_weights_on_the_async_engine_changes_and_restores(rollout, prompts, model_path):
    from transformers import AutoModelForCausalLM

    greedy = SamplingParams(do_sample=False, max_new_tokens=R)
    rows = _rows(prompts)[:16]

    def one_by_one():
        async def go():
            return await asyncio.gather(*(rollout.generate_one(r, greedy) for r in rows))

        return [r.token_ids for r in _run(go())]

    before, before_batch = one_by_one(), rollout.generate(prompts, greedy).batch["responses"]
    original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rollout.update_weights((k, 0.5 * v) for k, v in original.state_dict().items())
    assert one_by_one() != before
    rollout.update_weights(iter(original.state_dict().items()))
    assert one_by_one() == before
    assert torch.equal(rollout.generate(prompts, greedy).batch["responses"], before_batch)


def test_agent_loop_with_the_calculator_keeps_model_tokens_exactly(rollout, model_path, texts):
    from transformers import AutoTokenizer

    from rlcore.agent.loop import AgentLoop
    from rlcore.agent.parsers import HermesToolParser, ToolCall
    from rlcore.config import AgentConfig
    from rlcore.testing.prompts import prompt_batch
    from rlcore_calculator.tool import CalculatorTool

    tok = AutoTokenizer.from_pretrained(model_path)

    class FirstTurnCalls(HermesToolParser):
        """A random tiny model never writes a call: its first turn asks the calculator."""

        def parse(self, text: str) -> tuple[list[ToolCall], list[str]]:
            return [ToolCall(name="calculator", arguments={"expression": "12 * (3 + 4)"})], []

    results: list[tuple[list[int], Any]] = []
    original = rollout.generate_one

    async def recording(prompt_ids, sampling):
        result = await original(prompt_ids, sampling)
        results.append((list(prompt_ids), result))
        return result

    config = AgentConfig(
        tools=("calculator",), max_turns=2, max_tokens_per_turn=10, max_parallel_conversations=32
    )
    loop = AgentLoop(tok, [CalculatorTool()], config)
    loop.parser = FirstTurnCalls()

    chats = [f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n" for t in texts[:32]]
    prompts = prompt_batch(tok, chats)
    sampling = SamplingParams(max_new_tokens=200, temperature=1.0, return_log_probs=True)
    rollout.generate_one = recording  # type: ignore[method-assign]
    loads: list[int] = []

    def generate():
        done = threading.Event()

        def watch():  # the engine's load while the agent loop runs on its own event loop
            while not done.is_set():
                loads.append(rollout.llm.engine.get_num_unfinished_requests())
                time.sleep(0.002)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            return loop.generate(rollout, prompts, sampling)
        finally:
            done.set()
            watcher.join(timeout=30)

    try:
        out = generate()
    finally:
        del rollout.generate_one
    assert max(loads) > 1, "the conversations never overlapped in the engine"
    assert len(results) == 64  # 32 conversations x 2 model turns
    tool_ids = tok.encode(loop.parser.format_responses(["84"]), add_special_tokens=False)
    by_prompt = {tuple(p): r for p, r in results}
    for row in range(32):
        valid = prompts.batch["attention_mask"][row].bool()
        prompt = prompts.batch["input_ids"][row][valid].tolist()
        first = by_prompt[tuple(prompt)]
        # The second request is the conversation so far, ids untouched (no re-encoding).
        second = by_prompt[tuple(prompt + first.token_ids + tool_ids)]
        n1, nt, n2 = len(first.token_ids), len(tool_ids), len(second.token_ids)
        resp = out.batch["responses"][row].tolist()
        mask = out.batch["response_mask"][row].tolist()
        assert resp[: n1 + nt + n2] == first.token_ids + tool_ids + second.token_ids
        assert mask[: n1 + nt + n2] == [1] * n1 + [0] * nt + [1] * n2
        assert sum(mask) == n1 + n2
        lp = out.batch["rollout_log_probs"][row].tolist()
        assert lp[:n1] == pytest.approx(first.log_probs)
        assert lp[n1 + nt : n1 + nt + n2] == pytest.approx(second.log_probs)
        summary: Mapping[str, Any] = out.non_tensor_batch["agent"][row]
        assert summary["num_turns"] == 2
        assert summary["tool_errors"] == 0
        assert summary["turns"][1] == {"role": "tool", "content": "84"}
    print(f"\nagent: 32 conversations, up to {max(loads)} requests in the engine at once")


def test_partial_rollouts_continue_across_a_weight_sync_with_per_token_versions(
    rollout, prompts, model_path
):
    """A sync mid-generation (issue 45, item 4): the batch's requests are aborted, keep their
    tokens and continue with the new weights; each token records the version that sampled it,
    and its log-prob is that version's; the staleness bound then applies to the oldest token."""
    from transformers import AutoModelForCausalLM

    from rlcore.protocol import DataProto
    from rlcore.roles.rollout_worker import TOKEN_WEIGHT_VERSIONS_KEY, sample_versions
    from rlcore.trainer.async_queue import stale_rows

    original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    state = original.state_dict()
    halved = {k: 0.5 * v for k, v in state.items()}
    greedy = SamplingParams(do_sample=False, max_new_tokens=160, return_log_probs=True)
    batch = prompts[:16]
    rollout.update_weights(iter(state.items()), version=3)
    rollout.partial_rollouts = True  # the rollout's mode, not the engine's: one engine serves
    try:
        old_ref = rollout.generate(batch, greedy)  # the whole batch under version 3

        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(out=rollout.generate(batch, greedy)))
        thread.start()
        states = rollout.llm.engine.output_processor.request_states
        deadline = time.monotonic() + 60
        while not any(s.detokenizer.num_output_tokens() >= 8 for s in list(states.values())):
            assert time.monotonic() < deadline, "no request reached 8 tokens in 60 s"
            time.sleep(0.005)
        rollout.update_weights(iter(halved.items()), version=4)  # mid-generation
        thread.join(timeout=120)
        assert not thread.is_alive(), "the partial batch did not finish within 120 s"
        out = result["out"]
    finally:
        rollout.partial_rollouts = False
    assert rollout.llm.segments.continued > 0

    versions = out.batch[TOKEN_WEIGHT_VERSIONS_KEY]
    mask = out.batch["response_mask"].bool()
    resp, logp = out.batch["responses"], out.batch["rollout_log_probs"]
    assert set(versions[mask].tolist()) == {3, 4}
    split = []
    for i in range(len(out)):
        v = versions[i][mask[i]]
        k = int((v == 3).sum())
        assert torch.equal(v[:k], torch.full((k,), 3))
        assert bool((v[k:] == 4).all())
        # The old tokens are version 3's greedy tokens, with version 3's log-probs.
        assert torch.equal(resp[i, :k], old_ref.batch["responses"][i, :k])
        torch.testing.assert_close(logp[i, :k], old_ref.batch["rollout_log_probs"][i, :k])
        split.append(k)
    both = [i for i, k in enumerate(split) if 0 < k < int(mask[i].sum())]
    assert both, f"no sample spans the sync (old tokens per row: {split})"

    # The continued tokens are version 4's greedy continuation of prompt + old tokens, with
    # version 4's log-probs: regenerate those continuations in one shot under version 4.
    rows = [
        [*_rows(batch)[i], *resp[i, : split[i]].tolist()] for i in both
    ]  # fmt: skip
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    am = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    cont = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": am,
            "position_ids": (am.cumsum(-1) - 1).clamp(min=0),
        }
    )
    new_ref = rollout.generate(
        cont, SamplingParams(do_sample=False, max_new_tokens=160, return_log_probs=True)
    )
    for j, i in enumerate(both):
        k, n = split[i], int(mask[i].sum())
        assert torch.equal(resp[i, k:n], new_ref.batch["responses"][j, : n - k])
        torch.testing.assert_close(logp[i, k:n], new_ref.batch["rollout_log_probs"][j, : n - k])

    # One staleness rule, applied to each sample's oldest token: at actor version 4 with
    # max_staleness 0, exactly the samples holding a version-3 token are stale.
    out.non_tensor_batch["weight_version"] = sample_versions(out, rollout.weight_version)
    stale = stale_rows(4 - out.non_tensor_batch["weight_version"], 0)
    assert stale.tolist() == [k > 0 for k in split]
    assert not stale_rows(4 - out.non_tensor_batch["weight_version"], 1).any()
    rollout.update_weights(iter(state.items()))


class _AnswersTwice(BaseHarness):
    """An agent that only knows the ``openai`` client: answers, is asked again, answers."""

    def run(self, task, base_url, api_key):
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
        messages: list[Any] = list(task.messages)
        for turn in range(2):
            if turn:
                messages.append({"role": "user", "content": "Again?"})
            out = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
            messages.append({"role": "assistant", "content": out.choices[0].message.content})
        return messages[-1]["content"]


def test_the_async_engine_serves_the_agent_endpoint_and_a_harness_trains_its_tokens(
    rollout, model_path, texts
):
    """vLLM behind the OpenAI-compatible endpoint (issue 46): the endpoint's conformance check,
    then a harness's rows are exactly the tokens vLLM sampled, the loss on the model's only
    (re-tokenisation drift of the random model's bytes is allowed: the check counts it)."""
    from transformers import AutoTokenizer

    from rlcore.testing.conformance import check_harness, check_rollout_endpoint

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    check_rollout_endpoint(rollout, tokenizer)
    prompts = [[{"role": "user", "content": text}] for text in texts[:4]]
    report = check_harness(
        _AnswersTwice,
        rollout,
        tokenizer,
        prompts,
        max_new_tokens=96,
        allow_splits=True,
        allow_mismatch=True,
    )
    assert report.rows == 4
    assert report.calls == 2.0  # per row: both turns fit the sample's budget
    assert report.samples >= 4
