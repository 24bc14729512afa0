"""Decoding against each prompt's keys held once per group (rlcore_hf.prefix_attention).

The attention step against sdpa over the expanded keys; the rollout with ``share_prompt_kv``
on and off on a real model (the same tokens and log-probs, the shared path really taken); and
a model whose attention bypasses transformers' interface is an error, not wrong tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.testing.prompts import prompt_batch
from rlcore_hf.kv_cache import GrowingKVLayer
from rlcore_hf.prefix_attention import PrefixNotReadError, shared_prefix_decode
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (6, 1)])
def test_one_step_equals_sdpa_over_the_expanded_keys(heads, kv_heads, mask_kind):
    g = torch.Generator().manual_seed(0)
    groups, n, prompt, own, dim = 3, 4, 7, 5, 32
    rows = groups * n
    query = torch.randn(rows, heads, 1, dim, generator=g)
    prefix = [torch.randn(groups, kv_heads, prompt, dim, generator=g) for _ in range(2)]
    key, value = (torch.randn(rows, kv_heads, own, dim, generator=g) for _ in range(2))
    keep = torch.ones(rows, 1, 1, prompt + own, dtype=torch.bool)
    keep[:n, ..., :3] = False  # group 0's prompt is left-padded by 3 ...
    keep[n : 2 * n, ..., :1] = False  # ... group 1's by 1
    mask = {
        "none": None,
        "bool": keep,
        "additive": torch.zeros(keep.shape).masked_fill(~keep, float("-inf")),
    }[mask_kind]

    out = shared_prefix_decode(query, key, value, tuple(prefix), n, mask, scaling=None)

    full_k = torch.cat([prefix[0].repeat_interleave(n, 0), key], dim=2)
    full_v = torch.cat([prefix[1].repeat_interleave(n, 0), value], dim=2)
    per_kv = heads // kv_heads
    ref = F.scaled_dot_product_attention(
        query,
        full_k.repeat_interleave(per_kv, 1),
        full_v.repeat_interleave(per_kv, 1),
        attn_mask=None if mask is None else mask,
    )
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=2e-6)


TEXTS = ["What is 2+3?", "Hi", "abcdefgh 12", "Hi there, how are you?"]  # unequal: left padding
N = 4


@pytest.fixture(scope="module")
def rows(tiny_hf_path) -> DataProto:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_hf_path)
    return prompt_batch(tok, TEXTS).repeat(N, interleave=True)


def generate(path: str, rows: DataProto, sampling: SamplingParams, share_kv: bool, layers: list):
    rollout = HFRollout(
        RolloutSpec(model_path=path, seed=5), HFRollout.Config(share_prompt_kv=share_kv)
    )
    real = rollout._cache_kwargs

    def recording(sampling):  # keep the cache's layers, to see which path decoding took
        kwargs = real(sampling)
        layers.extend(next(iter(kwargs.values())).layers)
        return kwargs

    rollout._cache_kwargs = recording
    return rollout.generate(rows, sampling).batch


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=16, temperature=0.8, top_k=50, return_log_probs=True),
        SamplingParams(do_sample=False, max_new_tokens=16, return_log_probs=True),
    ],
    ids=["sampled", "greedy"],
)
def test_the_rollout_gives_the_same_tokens_with_the_prompt_kv_shared(tiny_hf_path, rows, sampling):
    shared_layers: list[GrowingKVLayer] = []
    own_layers: list[GrowingKVLayer] = []
    shared = generate(tiny_hf_path, rows, sampling, True, shared_layers)
    own = generate(tiny_hf_path, rows, sampling, False, own_layers)
    # really taken: every layer held the 4 prompts once and read them at every decoding step
    assert [(layer.group_size, layer.prefix[0].shape[0]) for layer in shared_layers] == [
        (N, len(TEXTS))
    ] * len(shared_layers)
    assert all(layer.prefix_reads == layer.prefix_steps > 0 for layer in shared_layers)
    assert all(layer.prefix is None for layer in own_layers)
    assert torch.equal(shared["responses"], own["responses"])
    assert int(own["response_mask"].sum()) > 2 * len(rows)  # responses of several tokens
    torch.testing.assert_close(
        shared["rollout_log_probs"], own["rollout_log_probs"], rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("padded", [True, False])
def test_attention_that_bypasses_the_interface_is_an_error_not_wrong_tokens(
    tiny_hf_path, rows, padded
):
    """A model that calls plain sdpa sees the generated keys alone: without padding that runs
    (wrong tokens), with it sdpa fails on the mask's shape. Either way, one error naming the
    key that turns the sharing off."""
    rollout = HFRollout(
        RolloutSpec(model_path=tiny_hf_path, seed=5), HFRollout.Config(share_prompt_kv=True)
    )
    rollout.model.config._attn_implementation = "sdpa"  # transformers' own, never ours
    if padded:
        batch = rows
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny_hf_path)
        batch = prompt_batch(tok, TEXTS[:1]).repeat(N, interleave=True)
        assert bool(batch.batch["attention_mask"].all())
    with pytest.raises(PrefixNotReadError, match=r"rollout\.share_prompt_kv = false"):
        rollout.generate(batch, SamplingParams(do_sample=False, max_new_tokens=4))
