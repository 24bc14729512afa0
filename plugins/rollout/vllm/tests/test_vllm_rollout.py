"""VLLMRollout on the real vLLM engine (CPU build), against the HF rollout and the HF model.

One engine for the whole module (each start costs 3-24 s here); tests that change its
weights put the originals back before they return.
"""

from __future__ import annotations

import os

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams

pytestmark = pytest.mark.usefixtures("need_vllm")

KV_GB = 0.0625  # small KV caches: several engines may live in one test process

R = 24  # max_new_tokens


@pytest.fixture(scope="module")
def spec(model_path):
    return RolloutSpec(model_path=model_path, max_prompt_length=64, max_response_length=R, seed=7)


@pytest.fixture(scope="module")
def rollout(spec):
    from rlcore_vllm.rollout import VLLMRollout

    # A small token budget and few sequences per step: prompts arrive while others decode,
    # over many engine steps, as in a large training batch (the quickstart's 256 x 35 tokens).
    config = VLLMRollout.Config(
        kv_cache_space_gb=KV_GB, max_num_seqs=16, max_num_batched_tokens=128
    )
    rollout = VLLMRollout(spec, config)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def hf_rollout(spec):
    from rlcore_hf.rollout import HFRollout

    torch.set_num_threads(1)
    return HFRollout(spec)


@pytest.fixture(scope="module")
def prompts(model_path, make_prompts, texts):
    return make_prompts(model_path, texts)


def hf_log_probs(model, out, temperature: float) -> torch.Tensor:
    """log p(response token) under softmax(logits / T) of the HF model: (B, R)."""
    p = out.batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits.float()
    logits = logits[:, p - 1 : -1] / temperature  # (B, R, V): position t predicts token t+1
    lp = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"].unsqueeze(-1))
    return lp.squeeze(-1) * out.batch["response_mask"]


def diff_stats(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    d = (a - b).abs()[mask.bool()]
    return float(d.mean()), float(d.max())


def test_greedy_equals_hf_rollout_token_for_token(rollout, hf_rollout, prompts):
    greedy = SamplingParams(do_sample=False, max_new_tokens=R)
    ours = rollout.generate(prompts, greedy)
    ref = hf_rollout.generate(prompts, greedy)
    assert len(ours) == 64
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask"):
        assert torch.equal(ours.batch[key], ref.batch[key]), key
    assert torch.equal(ours.batch["position_ids"], ref.batch["position_ids"])
    lengths = ours.batch["response_mask"].sum(1)
    # EOS is exercised: some rows end early (at several lengths), some run to R.
    assert int((lengths < R).sum()) >= 4
    assert len(set(lengths.tolist())) >= 4
    assert int((lengths == R).sum()) >= 4
    print(f"\ngreedy: 64/64 rows equal; response lengths {sorted(lengths.tolist())}")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_track_the_hf_model(rollout, hf_rollout, prompts, temperature):
    sampling = SamplingParams(temperature=temperature, max_new_tokens=R, return_log_probs=True)
    out = rollout.generate(prompts, sampling)
    mask = out.batch["response_mask"]
    lp = out.batch["rollout_log_probs"]
    assert lp.shape == mask.shape
    assert torch.all(lp[mask == 0] == 0)
    ref = hf_log_probs(hf_rollout.model, out, temperature)
    mean, mx = diff_stats(lp, ref, mask)
    print(
        f"\nT={temperature}: |vLLM - HF model| log-prob over {int(mask.sum())} tokens: "
        f"mean {mean:.2e}, max {mx:.2e}"
    )
    assert mx < 1e-3


def test_sampling_is_seeded_per_call_and_resumable(rollout, prompts):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)
    state = rollout.state_dict()
    a = rollout.generate(prompts, sampling)
    b = rollout.generate(prompts, sampling)
    assert not torch.equal(a.batch["responses"], b.batch["responses"])  # a new draw each call
    rollout.load_state_dict(state)
    again = rollout.generate(prompts, sampling)
    assert torch.equal(again.batch["responses"], a.batch["responses"])
    # Rows do not depend on their batch: the first 5 rows alone draw the same samples.
    rollout.load_state_dict(state)
    few = rollout.generate(prompts[:5], sampling)
    assert torch.equal(few.batch["responses"], a.batch["responses"][:5])


def test_update_weights_changes_outputs_and_originals_restore_them(
    rollout, hf_rollout, prompts, model_path
):
    from transformers import AutoModelForCausalLM

    greedy = SamplingParams(do_sample=False, max_new_tokens=R)
    before = rollout.generate(prompts, greedy).batch["responses"]
    original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    perturbed = {
        k: v + 0.02 * v.std() * torch.randn(v.shape, generator=gen)
        for k, v in original.state_dict().items()
    }
    rollout.update_weights(iter(perturbed.items()))
    try:
        changed = rollout.generate(prompts, greedy).batch["responses"]
        assert not torch.equal(changed, before)
        # After the update the rollout's log-probs are those of the new weights.
        hf_rollout.update_weights(iter(perturbed.items()))
        sampling = SamplingParams(temperature=1.0, max_new_tokens=R, return_log_probs=True)
        out = rollout.generate(prompts, sampling)
        ref = hf_log_probs(hf_rollout.model, out, 1.0)
        mean, mx = diff_stats(out.batch["rollout_log_probs"], ref, out.batch["response_mask"])
        print(f"\nafter update: |vLLM - HF model| log-prob mean {mean:.2e}, max {mx:.2e}")
        assert mx < 1e-3
    finally:
        rollout.update_weights(iter(original.state_dict().items()))
        hf_rollout.update_weights(iter(original.state_dict().items()))
    back = rollout.generate(prompts, greedy).batch["responses"]
    assert torch.equal(back, before)


def zero_the_weights(rollout, prompts, model_path):
    """Sync all-zero weights and check greedy output changes: (greedy, before, the originals)."""
    from transformers import AutoModelForCausalLM

    greedy = SamplingParams(do_sample=False, max_new_tokens=R)
    before = rollout.generate(prompts, greedy).batch["responses"]
    original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    zeros = [(k, torch.zeros_like(v)) for k, v in original.state_dict().items()]
    rollout.update_weights(iter(zeros))
    assert not torch.equal(rollout.generate(prompts, greedy).batch["responses"], before)
    return greedy, before, original


def test_bucketed_stream_of_whole_layers_restores_exactly(rollout, prompts, model_path):
    """The multiprocess transport's bucketing (files in /dev/shm), driven in-process."""

    from rlcore_vllm.weights import layer_buckets, save_bucket

    greedy, before, original = zero_the_weights(rollout, prompts, model_path)
    buckets = list(layer_buckets(original.state_dict().items(), bucket_bytes=1))
    assert len(buckets) >= 4  # embeddings, two layers, norm + head
    for bucket in buckets:
        path = save_bucket(bucket)
        try:
            rollout.llm.collective_rpc("rlcore_reload_from_file", args=(path,))
        finally:
            os.unlink(path)  # /dev/shm is RAM: a file left behind stays until reboot
    rollout.llm.reset_prefix_cache()
    assert torch.equal(rollout.generate(prompts, greedy).batch["responses"], before)


def test_prompt_longer_than_max_model_len_is_one_line(rollout, make_prompts, model_path):
    from rlcore_vllm.rollout import RolloutError

    long = make_prompts(model_path, ["x" * 60])
    with pytest.raises(RolloutError, match="exceeds the vLLM engine's max_model_len=88"):
        rollout.generate(long, SamplingParams(max_new_tokens=R))


def test_sleep_and_wake_up_are_no_ops_on_cpu(rollout, prompts):
    greedy = SamplingParams(do_sample=False, max_new_tokens=8)
    before = rollout.generate(prompts[:4], greedy).batch["responses"]
    rollout.sleep()
    rollout.wake_up()
    assert torch.equal(rollout.generate(prompts[:4], greedy).batch["responses"], before)


def test_bfloat16_engine_from_a_float32_policy(spec, hf_rollout, prompts, model_path):
    """[rollout] dtype = "bfloat16": float32 syncs are cast in; log-probs near the float32 model."""

    from rlcore_vllm.rollout import VLLMRollout

    rollout = VLLMRollout(spec, VLLMRollout.Config(kv_cache_space_gb=KV_GB, dtype="bfloat16"))
    try:
        assert rollout.llm.llm_engine.model_config.dtype == torch.bfloat16
        greedy, before, original = zero_the_weights(rollout, prompts, model_path)
        rollout.update_weights(iter(original.state_dict().items()))  # float32 in, cast
        assert torch.equal(rollout.generate(prompts, greedy).batch["responses"], before)
        sampling = SamplingParams(temperature=1.0, max_new_tokens=R, return_log_probs=True)
        out = rollout.generate(prompts, sampling)
        ref = hf_log_probs(hf_rollout.model, out, 1.0)
        mean, mx = diff_stats(out.batch["rollout_log_probs"], ref, out.batch["response_mask"])
        print(f"\nbfloat16 engine vs float32 model: log-prob diff mean {mean:.2e}, max {mx:.2e}")
        assert 0 < mean < 0.05  # bfloat16 rounding: visible, small
    finally:
        rollout.shutdown()
