"""The inverse-CDF sampler (rlcore_hf.sampler): it draws from the warped distribution that
``generate``'s own sampling draws from, and the rollout's tokens follow the model's
distribution with it as with ``torch.multinomial``."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.interfaces import RolloutSpec, SamplingParams
from rlcore_hf.rollout import HFRollout
from rlcore_hf.sampler import InverseCdfSampler

torch.set_num_threads(1)

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -3.0])


def warped(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The target distribution, by hand: softmax(l / T), keep the top k, then the smallest
    set of the most likely tokens whose mass reaches top_p, renormalised."""
    probs = torch.softmax(logits.double() / temperature, -1)
    order = probs.argsort(descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    mass = 0.0
    for rank, token in enumerate(order.tolist()):
        if (top_k and rank >= top_k) or mass >= top_p:
            break
        keep[token] = True
        mass += probs[token].item()
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.8), (0.9, 4, 0.9)],
)
def test_draws_follow_the_warped_distribution(temperature, top_k, top_p):
    rows = 200_000
    torch.manual_seed(0)
    sampler = InverseCdfSampler(temperature=temperature, top_k=top_k, top_p=top_p)
    scores = sampler(torch.zeros(rows, 1, dtype=torch.long), LOGITS.expand(rows, -1).clone())
    assert torch.isfinite(scores).sum(-1).eq(1).all()  # one token per row
    assert scores.max(-1).values.eq(0).all()
    tokens = scores.argmax(-1)
    freq = torch.bincount(tokens, minlength=len(LOGITS)).double() / rows
    target = warped(LOGITS, temperature, top_k, top_p)
    assert freq[target == 0].sum() == 0  # filtered tokens are never drawn
    # 5 standard deviations of a frequency over 200k draws
    bound = 5 * (target * (1 - target) / rows).sqrt() + 1e-9
    assert ((freq - target).abs() <= bound).all(), (freq, target)


def test_a_zero_probability_token_is_never_drawn_even_at_the_edges():
    """The draw u is in [0, total): searchsorted(right=True) skips flat stretches of the CDF."""
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(50_000, -1).clone()
    torch.manual_seed(1)
    tokens = InverseCdfSampler(temperature=1.0, top_k=0, top_p=1.0)(None, logits).argmax(-1)
    assert set(tokens.tolist()) == {0, 2}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    folder = tmp_path_factory.mktemp("sampler") / "model"
    return str(build_tiny_model(folder, hidden=64, heads=2, kv_heads=1))


def first_token_frequencies(path: str, inverse_cdf: bool, rows: int) -> torch.Tensor:
    from rlcore.protocol import DataProto

    rollout = HFRollout(
        RolloutSpec(model_path=path, seed=3), HFRollout.Config(inverse_cdf_sampling=inverse_cdf)
    )
    prompt = torch.tensor([[5, 9, 14, 22]]).expand(rows, -1)
    batch = DataProto.from_dict(
        tensors={"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    )
    sampling = SamplingParams(max_new_tokens=1, temperature=1.0, return_log_probs=True)
    out = rollout.generate(batch, sampling)
    first = out.batch["responses"][:, 0]
    # the rollout's own log-probs of its draws: one distribution for every row
    logp = out.batch["rollout_log_probs"][:, 0]
    vocab = rollout.model.config.vocab_size
    probs = torch.zeros(vocab, dtype=torch.float64)
    probs[first] = logp.double().exp()
    return torch.bincount(first, minlength=vocab).double() / rows, probs


def test_the_rollout_samples_the_models_distribution_either_way(tiny_path):
    """8,000 first tokens of one prompt, with the inverse CDF and with torch.multinomial: each
    histogram within 5 standard deviations of the model's probabilities (read from the
    rollout's log-probs), and the two draws differ (another random stream)."""
    rows = 8_000
    ours, probs = first_token_frequencies(tiny_path, True, rows)
    theirs, probs_hf = first_token_frequencies(tiny_path, False, rows)
    seen = (probs > 0) & (probs_hf > 0)
    assert torch.allclose(probs[seen], probs_hf[seen], atol=1e-6)
    probs = torch.where(probs > 0, probs, probs_hf)
    bound = 5 * (probs * (1 - probs) / rows).sqrt() + 5 / rows
    for freq in (ours, theirs):
        assert ((freq - probs).abs() <= bound).all()
    assert not torch.equal(ours, theirs)
    assert math.isclose(float(ours.sum()), 1.0)
