"""The tests that need an engine of their own: the rollout conformance suite, the multiprocess
engine (weight sync through safetensors files), and an engine that cannot fit its KV cache."""

from __future__ import annotations

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams

pytestmark = pytest.mark.usefixtures("need_vllm")

KV_GB = 0.0625


@pytest.mark.parametrize("async_engine", [False, True], ids=["LLM", "AsyncLLM"])
def test_vllm_rollout_conformance(model_path, async_engine):
    from rlcore.testing.conformance import check_rollout
    from rlcore_vllm.rollout import VLLMRollout

    config = VLLMRollout.Config(kv_cache_space_gb=KV_GB, async_engine=async_engine)
    check_rollout(VLLMRollout, config, model_path=model_path)


def test_multiprocess_engine_syncs_weights_through_files(model_path, make_prompts, texts):
    """EngineCore in a subprocess: tensors cross as safetensors buckets, never pickled."""
    from transformers import AutoModelForCausalLM

    from rlcore_vllm.rollout import VLLMRollout

    spec = RolloutSpec(model_path=model_path, max_prompt_length=64, max_response_length=16)
    config = VLLMRollout.Config(kv_cache_space_gb=KV_GB, multiprocessing=True, weight_bucket_mb=1)
    rollout = VLLMRollout(spec, config)
    try:
        assert not rollout.in_process
        prompts = make_prompts(model_path, texts[:16])
        greedy = SamplingParams(do_sample=False, max_new_tokens=16)
        before = rollout.generate(prompts, greedy).batch["responses"]
        original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        rollout.update_weights((k, 0.5 * v) for k, v in original.state_dict().items())
        assert not torch.equal(rollout.generate(prompts, greedy).batch["responses"], before)
        rollout.update_weights(iter(original.state_dict().items()))
        assert torch.equal(rollout.generate(prompts, greedy).batch["responses"], before)
    finally:
        rollout.shutdown()


def test_kv_cache_too_small_is_one_line(model_path):
    from rlcore.errors import ConfigError
    from rlcore_vllm.rollout import VLLMRollout

    spec = RolloutSpec(model_path=model_path, max_prompt_length=1024, max_response_length=1024)
    with pytest.raises(ConfigError) as err:
        VLLMRollout(spec, VLLMRollout.Config(kv_cache_space_gb=0.0001))
    text = str(err.value)
    assert "\n" not in text
    assert "out of KV cache" in text
    assert "kv_cache_space_gb" in text
