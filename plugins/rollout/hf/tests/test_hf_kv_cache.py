"""The preallocated KV cache (rlcore_hf.kv_cache): the same generations as transformers' own.

Real model, real ``generate``: the rollout with ``preallocate_kv_cache`` on and off must give
the same tokens (sampled with one seed, and greedy) and the same sampled log-probs; the
layer itself must append in place and survive the methods that replace its tensors.
"""

from __future__ import annotations

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore.protocol import DataProto
from rlcore.testing.prompts import prompt_batch
from rlcore_hf.kv_cache import GrowingKVLayer, growing_cache
from rlcore_hf.rollout import HFRollout

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    return str(
        build_tiny_model(
            tmp_path_factory.mktemp("kv_cache") / "model", hidden=64, heads=2, kv_heads=1
        )
    )


def prompt_rows(tiny_path: str) -> DataProto:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    return prompt_batch(tok, ["What is 2+3?", "Hi", "abcdefgh 12"]).repeat(4, interleave=True)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=24, temperature=1.0, return_log_probs=True),
        SamplingParams(do_sample=False, max_new_tokens=24),
    ],
    ids=["sampled", "greedy"],
)
def test_same_generations_as_transformers_cache(tiny_path, sampling):
    rows = prompt_rows(tiny_path)
    outs = {}
    for prealloc in (False, True):
        rollout = HFRollout(
            RolloutSpec(model_path=tiny_path, seed=3),
            HFRollout.Config(preallocate_kv_cache=prealloc),
        )
        kwargs = rollout._cache_kwargs(sampling)
        if prealloc:  # really in use, not silently skipped
            (cache,) = kwargs.values()
            assert all(isinstance(layer, GrowingKVLayer) for layer in cache.layers)
        else:
            assert kwargs == {}
        outs[prealloc] = rollout.generate(rows, sampling).batch
    assert torch.equal(outs[True]["responses"], outs[False]["responses"])
    assert torch.equal(outs[True]["response_mask"], outs[False]["response_mask"])
    assert int(outs[True]["response_mask"].sum()) > len(rows)  # responses of several tokens
    if sampling.return_log_probs:
        torch.testing.assert_close(
            outs[True]["rollout_log_probs"], outs[False]["rollout_log_probs"], rtol=0, atol=1e-6
        )


def test_layer_appends_in_place_and_adopts_replaced_tensors(tiny_path):
    from transformers import AutoModelForCausalLM

    cache = growing_cache(AutoModelForCausalLM.from_pretrained(tiny_path), reserve=4)
    assert cache is not None
    layer = cache.layers[0]
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(2, 1, n, 32, generator=g) for n in (5, 1, 1, 1, 1)]
    keys, _ = layer.update(parts[0], -parts[0])
    buffer = keys.untyped_storage().data_ptr()
    for part in parts[1:]:
        keys, values = layer.update(part, -part)
    assert keys.untyped_storage().data_ptr() == buffer  # 5 + 4 fit the first buffer
    expected = torch.cat(parts, dim=2)
    assert torch.equal(keys, expected)
    assert torch.equal(values, -expected)
    assert layer.get_seq_length() == 9
    # Past the first buffer's room (5 + max(4, 5) = 10 tokens): a bigger one, contents kept.
    extra = torch.randn(2, 1, 2, 32, generator=g)
    keys, _ = layer.update(extra, -extra)
    assert keys.untyped_storage().data_ptr() != buffer
    assert torch.equal(keys, torch.cat([expected, extra], dim=2))
    # Methods that replace keys/values (beam reordering, crop) are adopted by the next update.
    layer.batch_select_indices(torch.tensor([1, 0]))
    layer.crop(-2)
    step = torch.randn(2, 1, 1, 32, generator=g)
    keys, values = layer.update(step, -step)
    kept = torch.cat([expected, extra], dim=2)[[1, 0], :, :-2]
    assert torch.equal(keys, torch.cat([kept, step], dim=2))
    assert torch.equal(values, -torch.cat([kept, step], dim=2))
