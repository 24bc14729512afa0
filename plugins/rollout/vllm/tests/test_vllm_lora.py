"""``lora_sync = "adapter"`` on the real vLLM engine: each ``update_adapter`` is served under a
new adapter id (a reused id would keep the adapter vLLM cached), its folder is private and
only the current one stays on disk; an adapter rank above ``max_lora_rank`` is one line."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from rlcore.errors import ConfigError
from rlcore.interfaces import RolloutSpec, SamplingParams

pytestmark = pytest.mark.usefixtures("need_vllm")

GREEDY = SamplingParams(do_sample=False, max_new_tokens=8, return_log_probs=True)


def _adapter(model_path: str, *, rank: int, zero_b: bool) -> tuple[dict, dict]:
    """(peft config dict, tensors under peft folder names) of a random LoRA adapter on q/v."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    tensors = {k: v.clone() for k, v in get_peft_model_state_dict(peft_model).items()}
    if zero_b:  # B = 0: the adapter adds nothing, as a fresh peft adapter
        tensors = {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in tensors.items()}
    return peft_model.peft_config["default"].to_dict(), tensors


@pytest.fixture(scope="module")
def rollout(model_path):
    from rlcore_vllm.rollout import VLLMRollout

    spec = RolloutSpec(model_path=model_path, max_prompt_length=64, max_response_length=8)
    config = VLLMRollout.Config(kv_cache_space_gb=0.0625, lora_sync="adapter", max_lora_rank=8)
    assert VLLMRollout.traits(config).lora_adapters
    assert not VLLMRollout.traits(VLLMRollout.Config()).lora_adapters  # merged by default
    rollout = VLLMRollout(spec, config)
    yield rollout
    rollout.shutdown()


def test_each_sync_is_a_new_adapter_and_the_old_one_is_gone(rollout, model_path, make_prompts):
    prompts = make_prompts(model_path, [f"What is {i} + {i}?" for i in range(8)])
    base = rollout.generate(prompts, GREEDY).batch["rollout_log_probs"]

    config, trained = _adapter(model_path, rank=8, zero_b=False)
    rollout.update_adapter(config, trained.items())
    first = rollout.adapter.request
    folder = first.lora_path
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    served = rollout.generate(prompts, GREEDY).batch["rollout_log_probs"]
    assert (served - base).abs().max() > 1e-3  # the adapter is applied

    # Same config, B = 0: what vLLM serves must be the base model again, not the cached one.
    _, zero = _adapter(model_path, rank=8, zero_b=True)
    rollout.update_adapter(config, zero.items())
    assert rollout.adapter.request.lora_int_id == first.lora_int_id + 1
    assert not os.path.exists(folder)  # the previous adapter's folder is deleted
    again = rollout.generate(prompts, GREEDY).batch["rollout_log_probs"]
    assert (again - base).abs().max() < 1e-5


def test_an_adapter_rank_above_max_lora_rank_is_one_line(rollout, model_path):
    config, tensors = _adapter(model_path, rank=16, zero_b=True)
    with pytest.raises(ConfigError) as err:
        rollout.update_adapter(config, tensors.items())
    assert str(err.value) == (
        "[rollout] max_lora_rank = 8 is below the actor's LoRA rank 16 ([actor.engine] "
        "lora_rank); set [rollout] max_lora_rank = 16"
    )
