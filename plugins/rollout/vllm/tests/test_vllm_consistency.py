"""The consistency check (rlcore.testing.conformance.check_consistency) on the vLLM rollout.

vLLM's own forward (``prompt_logprobs = -1``) against the FSDP2 engine on the tiny model, in
float32: in sync the distributions agree; one engine update not synced (the control) fails
the check, and the hidden states of vLLM's decoder layers (forward hooks, in process) name
layer 0 as the first that parts.
"""

from __future__ import annotations

import attrs
import pytest
import torch

from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.testing.conformance import check_consistency, measure_consistency

pytestmark = pytest.mark.usefixtures("need_vllm")


def test_vllm_consistency_in_sync_and_one_sync_behind(model_path, make_prompts, texts):
    import torch.distributed as dist

    from rlcore_fsdp2.engine import FSDP2Engine
    from rlcore_vllm.rollout import VLLMRollout

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        engine = FSDP2Engine(
            EngineSpec(
                role="actor",
                model_path=model_path,
                optim=OptimConfig(lr=1e-2),
                micro_batch_size=4,
                dtype="float32",
                total_steps=1,
            ),
            FSDP2Engine.Config(use_remove_padding=False),
        )
        spec = RolloutSpec(model_path=model_path, max_prompt_length=64, max_response_length=8)
        rollout = VLLMRollout(spec, VLLMRollout.Config(kv_cache_space_gb=0.0625, max_logprobs=-1))
        rollout.update_weights(engine.named_parameters_for_sync())
        rows = rollout.generate(
            make_prompts(model_path, texts[:4]), SamplingParams(temperature=1.0, max_new_tokens=8)
        )
        report = check_consistency(rollout, engine, rows)  # float32: KL ~1e-14 here
        assert report.metrics["top_k_overlap"][1] == 1.0

        batch = rows.select(
            batch_keys=["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
        )
        batch.batch["advantages"] = torch.randn(rows.batch["responses"].shape)

        def loss_fn(outputs, mb, totals):
            mask = mb.batch["response_mask"].to(outputs.log_probs.dtype)
            loss = -(outputs.log_probs * mb.batch["advantages"] * mask).sum() / totals.tokens
            return loss, {}

        engine.forward_backward(batch, loss_fn, temperature=1.0)
        engine.optimizer_step(lr=1e-2)
        behind = measure_consistency(rollout, engine, rows)  # KL ~3e-2
        assert not behind.passed
        assert behind.layer_errors is not None
        assert len(behind.layer_errors) == 2
        assert behind.first_layer == 0

        # Without vLLM's max_logprobs = -1 the rollout refuses, in one line naming the key.
        rollout.config = attrs.evolve(rollout.config, max_logprobs=20)
        with pytest.raises(AssertionError, match=r"rollout\.max_logprobs = -1") as refusal:
            check_consistency(rollout, engine, rows)
        assert "\n" not in str(refusal.value)
        rollout.shutdown()
    finally:
        if dist.is_initialized():  # vLLM's shutdown may have taken the group down already
            dist.destroy_process_group()
