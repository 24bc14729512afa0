"""The SGLang rollout's engine path on CPU, through a stand-in engine that enforces SGLang
0.5.23's rules (``_standin_engine``: one bound event loop, weights dropped on release, resume
of an unreleased tag refused, flush refused while running, a SIGTERM handler on the first
request, a shutdown that kills every child). SGLang itself never ran here (its CPU
engine needs a CPU build of sgl-kernel that no package index carries; see the README)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.agent.loop import AgentLoop
from rlcore.config import AgentConfig
from rlcore.errors import RlcoreError
from rlcore.interfaces import BaseRollout, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore_sglang.rollout import SGLangRollout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _standin_engine import StandInEngine

EOS, VOCAB = 2, 200
WEIGHTS = {"w": torch.ones(4, 4), "b": torch.zeros(4)}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from rlcore.testing.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tok"), hidden=64, layers=1, heads=2)
    return AutoTokenizer.from_pretrained(path)


def _rollout(**config) -> SGLangRollout:
    """The plugin's SGLangRollout around the stand-in (its __init__ needs SGLang and a GPU)."""
    rollout = object.__new__(SGLangRollout)
    BaseRollout.__init__(
        rollout,
        RolloutSpec(model_path="-", dtype="float32"),
        SGLangRollout.Config(request_timeout_s=20.0, **config),
    )
    rollout._init_state()
    rollout.engine = StandInEngine(WEIGHTS, eos=EOS, vocab=VOCAB)
    rollout.eos_token_ids, rollout.pad_token_id = [EOS], 0
    rollout.device = torch.device("cpu")
    return rollout


def _prompts(n: int = 3, width: int = 6) -> DataProto:
    ids = torch.randint(10, 100, (n, width))
    mask = torch.ones(n, width, dtype=torch.long)
    mask[0, :2] = 0
    ids[0, :2] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    )


def test_the_standin_enforces_one_bound_loop_and_drop_on_release():
    engine = StandInEngine(WEIGHTS, eos=EOS, vocab=VOCAB)
    params = {"max_new_tokens": 4}
    engine.loop.run_until_complete(engine.async_generate([5, 6], params))  # binds engine.loop
    with pytest.raises(RuntimeError, match="other than the one"):
        asyncio.run(engine.async_generate([5, 6], params))
    engine.release_memory_occupation(["weights"])
    assert engine.weights is None
    with pytest.raises(KeyError):
        engine.resume_memory_occupation(["kv_cache"])
    assert engine.update_weights_from_tensor([("w", torch.ones(1))])[0] is False  # no session
    engine.loop.close()


def test_agent_loop_drives_generate_one_from_its_own_event_loop(tokenizer):
    """The [agent] path: AgentLoop.generate runs its own loop and awaits generate_one there;
    SGLang's loop must serve the requests. Sync calls (weight sync, batch generate, sleep)
    before, between and after agent runs keep working, and SIGTERM stays rlcore's."""
    rollout = _rollout()
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        agent = AgentLoop(tokenizer, [], AgentConfig())
        sampling = SamplingParams(max_new_tokens=6, return_log_probs=True)
        rollout.sleep()  # everything released, as when colocated
        rollout.wake_up()
        rollout.update_weights(iter(WEIGHTS.items()))
        first = agent.generate(rollout, _prompts(), sampling)
        assert first.batch["responses"].shape[0] == 3
        assert first.batch["response_mask"].sum() > 0
        assert signal.getsignal(signal.SIGTERM) is sigterm  # the requests bound a thread's loop
        batch = rollout.generate(_prompts(), sampling)  # sync path after the agent run
        assert batch.batch["responses"].shape[0] == 3
        rollout.sleep()
        rollout.wake_up()
        rollout.update_weights(iter(WEIGHTS.items()))
        again = agent.generate(rollout, _prompts(), sampling)
        assert again.batch["responses"].shape == first.batch["responses"].shape
        assert signal.getsignal(signal.SIGTERM) is sigterm
    finally:
        rollout._park_loop()
        rollout.engine.loop.close()
        signal.signal(signal.SIGTERM, sigterm)


def test_sync_calls_in_the_main_thread_keep_rlcore_sigterm_handler():
    rollout = _rollout()
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        out = rollout.generate(_prompts(), SamplingParams(max_new_tokens=6))
        assert out.batch["responses"].shape[0] == 3
        assert rollout.engine.sigterm_added  # SGLang's rule fired in the main thread ...
        assert signal.getsignal(signal.SIGTERM) is sigterm  # ... and ours is back
    finally:
        rollout.engine.loop.close()
        signal.signal(signal.SIGTERM, sigterm)


def test_a_wake_up_without_sync_is_caught_by_the_dropped_weights():
    """SGLang drops weights on release: generating after wake_up without a sync reads nothing
    (the GPU check re-syncs after wake_up for this reason)."""
    rollout = _rollout()
    try:
        sampling = SamplingParams(max_new_tokens=6)
        before = rollout.generate(_prompts(), sampling).batch["responses"]
        rollout.sleep()
        rollout.wake_up()
        assert rollout.engine.weights == {}
        rollout.update_weights(iter(WEIGHTS.items()))
        after = rollout.generate(_prompts(), sampling).batch["responses"]
        assert torch.equal(before[:, :2].ne(0), after[:, :2].ne(0))
    finally:
        rollout.engine.loop.close()


def test_close_stops_sglang_processes_and_leaves_other_children_alone():
    rollout = _rollout()
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        engine = rollout.engine
        scheduler = engine.start_child()
        rollout.close()
        assert engine.would_kill is None  # SGLang's blanket kill was not called
        assert scheduler.wait(30) is not None
        assert unrelated.poll() is None
        assert rollout.engine is None
    finally:
        unrelated.kill()
        unrelated.wait(30)


def test_generate_one_timeout_names_the_key():
    rollout = _rollout()
    rollout.config = SGLangRollout.Config(request_timeout_s=0.2)

    async def slow(*args, **kwargs):
        await asyncio.sleep(5)

    rollout.engine.async_generate = slow
    try:
        with pytest.raises(RlcoreError, match=r"rollout\.request_timeout_s=0\.2"):
            asyncio.run(rollout.generate_one([5, 6], SamplingParams(max_new_tokens=4)))
    finally:
        rollout._park_loop()
        rollout.engine.loop.close()
