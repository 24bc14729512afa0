"""The OpenAI-compatible endpoint (rlcore.agent.endpoint) on the real HF rollout, called
with the ``openai`` client: recorded tokens, bounds, the API key, loopback only."""

from __future__ import annotations

import httpx
import openai
import pytest

from rlcore.agent.endpoint import EndpointLimits, EndpointServer
from rlcore.agent.parsers import HermesToolParser
from rlcore.interfaces import RolloutSpec, SamplingParams


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("endpoint"), hidden=64, layers=1, heads=2)


@pytest.fixture(scope="module")
def server(model_path):
    from transformers import AutoTokenizer

    from rlcore_hf.rollout import HFRollout

    rollout = HFRollout(RolloutSpec(model_path=str(model_path), seed=1))
    tok = AutoTokenizer.from_pretrained(model_path)
    limits = EndpointLimits(max_tokens_per_call=8, max_calls=3, max_request_bytes=4096)
    srv = EndpointServer(
        rollout, tok, parser=HermesToolParser(), limits=limits, version=lambda: 7
    ).start()
    yield srv
    srv.stop()


def _sampling():
    return SamplingParams(max_new_tokens=64, temperature=1.0, return_log_probs=True)


def test_chat_and_completion_calls_are_recorded_token_for_token(server):
    sid = server.open_session(_sampling(), budget=64)
    client = openai.OpenAI(base_url=server.base_url(sid), api_key=server.api_key)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    out = client.chat.completions.create(
        model="policy", messages=messages, tools=tools, max_tokens=50
    )
    text = out.choices[0].message.content
    comp = client.completions.create(model="policy", prompt=[5, 6, 7], max_tokens=4)
    session = server.close_session(sid)
    chat, raw = session.calls
    tok = server.tokenizer
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat.prompt_ids == tok.encode(rendered, add_special_tokens=False)
    # max_tokens=50 capped by max_tokens_per_call: 8 tokens, or fewer ending at an EOS.
    ended = chat.completion_ids[-1] in server.rollout.eos_token_ids
    assert len(chat.completion_ids) == 8 or (ended and len(chat.completion_ids) < 8)
    assert len(chat.log_probs) == len(chat.completion_ids)
    assert tok.decode(chat.completion_ids, skip_special_tokens=True) == text
    assert chat.weight_version == 7
    assert chat.messages == messages
    assert out.usage.completion_tokens == len(chat.completion_ids)
    assert raw.prompt_ids == [5, 6, 7]
    raw_ended = raw.completion_ids[-1] in server.rollout.eos_token_ids
    assert len(raw.completion_ids) == 4 or (raw_ended and len(raw.completion_ids) < 4)
    assert comp.choices[0].text == raw.text


def test_wrong_key_closed_session_flood_and_big_bodies_are_refused(server):
    sid = server.open_session(_sampling(), budget=64)
    bad = openai.OpenAI(base_url=server.base_url(sid), api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="policy", prompt="hi", max_tokens=2)
    client = openai.OpenAI(base_url=server.base_url(sid), api_key=server.api_key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as big:
        client.completions.create(model="policy", prompt="x" * 5000, max_tokens=2)
    assert big.value.status_code == 413
    for _ in range(3):
        client.completions.create(model="policy", prompt="hi", max_tokens=2)
    with pytest.raises(openai.RateLimitError):  # the 4th call of a 3-call sample
        client.completions.create(model="policy", prompt="hi", max_tokens=2)
    session = server.close_session(sid)
    assert len(session.calls) == 3
    assert session.refused == {"flood": 1}
    with pytest.raises(openai.APIStatusError) as gone:
        client.completions.create(model="policy", prompt="hi", max_tokens=2)
    assert gone.value.status_code == 410


def test_listens_on_loopback_only(server):
    assert server.root_url.startswith("http://127.0.0.1:")
    assert (
        httpx.get(
            f"{server.root_url}/s/x/v1/models",
            headers={"Authorization": f"Bearer {server.api_key}"},
        ).status_code
        == 200
    )
    # The bound socket itself: loopback, not 0.0.0.0.
    bound = {sock.getsockname()[0] for srv in server._server.servers for sock in srv.sockets}
    assert bound == {"127.0.0.1"}


def test_a_generation_past_request_timeout_is_answered_504_and_not_recorded(server):
    import asyncio

    from rlcore.interfaces import BaseRollout

    class Hangs(BaseRollout):  # a stand-in for a stuck engine: only the wait is under test
        def generate(self, prompts, sampling):
            raise NotImplementedError

        def update_weights(self, named_tensors):
            pass

        async def generate_one(self, prompt_ids, sampling):
            await asyncio.sleep(30)

    slow = EndpointServer(
        Hangs(RolloutSpec(model_path="unused")), server.tokenizer,
        limits=EndpointLimits(request_timeout_s=0.3),
    ).start()  # fmt: skip
    try:
        sid = slow.open_session(_sampling(), budget=64)
        client = openai.OpenAI(base_url=slow.base_url(sid), api_key=slow.api_key, max_retries=0)
        with pytest.raises(openai.APIStatusError) as late:
            client.completions.create(model="policy", prompt="hi", max_tokens=2)
        assert late.value.status_code == 504
        session = slow.close_session(sid)
        assert session.calls == []
        assert session.refused == {"timeout": 1}
    finally:
        slow.stop()
