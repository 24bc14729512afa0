"""Chunked log-probs and entropy (rlcore.engine) equal the plain one-shot computation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlcore.engine import entropy_from_logits, log_probs_from_logits  # noqa: E402


def plain_log_probs(logits, labels):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def plain_entropy(logits):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1, 4, 5, 1000])
def test_chunked_log_probs_and_entropy_equal_the_plain_path(dtype, chunk):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 7, 301, generator=g)).to(dtype)
    labels = torch.randint(0, 301, (3, 7), generator=g)
    lp = log_probs_from_logits(logits, labels, chunk_tokens=chunk)
    assert lp.shape == (3, 7)
    assert lp.dtype == torch.float32
    # log-probs here reach ~-20: two float32 roundings of the same sum differ by ~|x| * 2**-23,
    # so the bound is relative as well as absolute (a wrong chunk is off by whole units).
    torch.testing.assert_close(lp, plain_log_probs(logits, labels), atol=1e-6, rtol=1e-6)
    ent = entropy_from_logits(logits, chunk_tokens=chunk)
    torch.testing.assert_close(ent, plain_entropy(logits), atol=1e-5, rtol=0)
    one_shot = log_probs_from_logits(logits, labels, chunk_tokens=None)
    torch.testing.assert_close(lp, one_shot, atol=1e-6, rtol=1e-6)


def test_chunked_gradients_equal_the_plain_path():
    g = torch.Generator().manual_seed(1)
    base = 3 * torch.randn(4, 6, 257, generator=g)
    labels = torch.randint(0, 257, (4, 6), generator=g)
    weights = torch.randn(4, 6, generator=g)

    def grad_of(fn):
        x = base.clone().requires_grad_(True)
        lp, ent = fn(x)
        ((lp * weights).sum() + 0.1 * ent.sum()).backward()
        return x.grad

    chunked = grad_of(
        lambda x: (
            log_probs_from_logits(x, labels, chunk_tokens=5),
            entropy_from_logits(x, chunk_tokens=5),
        )
    )
    plain = grad_of(lambda x: (plain_log_probs(x, labels), plain_entropy(x)))
    torch.testing.assert_close(chunked, plain, atol=1e-6, rtol=0)
