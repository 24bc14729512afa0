"""Weight sync FSDP2 engine -> HF rollout in one process: the rollout then computes the actor."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlcore.interfaces import EngineSpec, OptimConfig, RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.testing.prompts import prompt_batch
from rlcore_fsdp2.engine import FSDP2Engine
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("tied", [False, True])
def test_rollout_matches_actor_after_weight_sync(tmp_path, tied):
    from transformers import AutoTokenizer

    from rlcore.testing.tiny_model import build_tiny_model

    path = str(
        build_tiny_model(tmp_path / "m", hidden=64, heads=2, kv_heads=1, tie_word_embeddings=tied)
    )
    tok = AutoTokenizer.from_pretrained(path)
    rollout = HFRollout(RolloutSpec(model_path=path))
    spec = EngineSpec(role="actor", model_path=path, optim=OptimConfig(lr=1e-2), micro_batch_size=4)
    actor = FSDP2Engine(spec, FSDP2Engine.Config())

    prompts = prompt_batch(tok, ["2+2=", "Say hi", "x"]).repeat(2, interleave=True)
    temperature = 0.9
    gen = rollout.generate(prompts, SamplingParams(max_new_tokens=6, temperature=temperature))
    batch = gen.union(DataProto.from_dict(tensors={"advantages": torch.randn(6, 6)}))

    # --- one actor step moves the weights away from the rollout's
    def loss_fn(outputs, mb, totals):
        m = mb.batch["response_mask"].float()
        loss = -(outputs.log_probs * mb.batch["advantages"] * m).sum() / totals.tokens
        return loss, {}

    actor.forward_backward(batch, loss_fn, temperature=temperature)
    actor.optimizer_step(lr=1e-2)

    def rollout_logits():
        b = batch.batch
        with torch.no_grad():
            return rollout.model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                position_ids=b["position_ids"],
            ).logits

    def actor_logits():
        b = batch.batch
        actor.model.eval()
        with torch.no_grad():
            return actor.model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                position_ids=b["position_ids"],
            ).logits

    expected = actor_logits()
    assert not torch.allclose(rollout_logits(), expected, atol=1e-3)

    # --- sync, then the rollout computes exactly the actor's function
    rollout.update_weights(actor.named_parameters_for_sync())
    valid = batch.batch["attention_mask"].bool()
    torch.testing.assert_close(rollout_logits()[valid], expected[valid], atol=1e-5, rtol=0)
    if tied:
        assert (
            rollout.model.lm_head.weight.data_ptr()
            == rollout.model.model.embed_tokens.weight.data_ptr()
        )

    # Rollout log-probs of new samples equal the actor's recomputation (old_log_probs).
    gen = rollout.generate(
        prompts,
        SamplingParams(max_new_tokens=6, temperature=temperature, return_log_probs=True),
    )
    old = actor.compute_log_prob(gen, temperature=temperature).log_probs
    old = old * gen.batch["response_mask"]
    torch.testing.assert_close(gen.batch["rollout_log_probs"], old, atol=1e-4, rtol=0)
