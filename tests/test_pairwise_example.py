"""The algorithm guide's pairwise loss (docs/writing-an-algorithm.md, "A pairwise loss") through
the engines' real micro-batch loop: kept pairs on 2 ranks, one row per micro-batch.

With ``keep_groups`` (``group_index``) each pair is one micro-batch and the gradient equals the
one-micro-batch gradient; without it the pairs are cut and the gradient differs. The model is a
stand-in (one logit per token id): the loop and the layout are under test, not a network.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from rlcore.engine import accumulate_gradients
from rlcore.interfaces import EngineSpec, ModelOutputs
from rlcore.protocol import DataProto
from rlcore.trainer.layout import group_index, mini_batch_layout

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "writing-an-algorithm.md"
VOCAB, R = 7, 5


def guide_pairwise_loss():
    text = GUIDE.read_text(encoding="utf-8")
    block = re.search(
        r"<!-- pairwise-loss -->\n```python\n(.*?)```\n<!-- /pairwise-loss -->", text, re.S
    )
    assert block is not None, "the guide's pairwise-loss block is gone"
    scope: dict[str, object] = {}
    exec(compile(block.group(1), str(GUIDE), "exec"), scope)  # our own docs, not user input
    return scope["pairwise_loss"]


def pairs_batch() -> DataProto:
    """5 prompts' chosen and rejected responses, handed over chosen-first then rejected."""
    g = torch.Generator().manual_seed(0)
    responses = torch.randint(0, VOCAB, (10, R), generator=g)
    lengths = torch.randint(1, R + 1, (10,), generator=g)
    mask = (torch.arange(R) < lengths[:, None]).long()
    sign = torch.tensor([1.0] * 5 + [-1.0] * 5)
    uids = np.array([f"p{i % 5}" for i in range(10)], dtype=object)
    return DataProto.from_dict(
        tensors={
            "responses": responses,
            "response_mask": mask,
            "attention_mask": mask,
            "advantages": sign[:, None] * mask,
        },
        non_tensors={"uid": uids},
    )


def gradient(batch: DataProto, loss_fn, micro_batch_size: int) -> torch.Tensor:
    theta = torch.zeros(VOCAB, requires_grad=True)
    with torch.no_grad():
        theta.copy_(torch.linspace(-1, 1, VOCAB))

    def forward(mb: DataProto) -> ModelOutputs:
        logp = torch.log_softmax(theta, -1)[mb.batch["responses"]]  # (b, R)
        return ModelOutputs(log_probs=logp * mb.batch["response_mask"])

    spec = EngineSpec(role="actor", model_path="-", micro_batch_size=micro_batch_size)
    # Two ranks, one after the other: each rank's share of the mini-batch, summed gradients.
    for rank in batch.chunk(2):
        accumulate_gradients(rank, loss_fn, forward, spec=spec)
    assert theta.grad is not None
    return theta.grad.clone()


def test_the_guides_pairwise_loss_needs_and_gets_whole_pairs_per_micro_batch():
    loss_fn = guide_pairwise_loss()
    batch = pairs_batch()
    kept = mini_batch_layout(
        batch.select(non_tensor_batch_keys=[]),
        rows_per_mini_batch=10,
        mini_batches=1,
        world_size=2,
        groups=group_index(batch),
    )
    # Without Ray each rank's totals are its own share's; the reference is the same rows in
    # one micro-batch per rank, so both divide alike.
    reference = gradient(kept, loss_fn, micro_batch_size=64)
    assert float(reference.abs().sum()) > 0
    assert torch.allclose(gradient(kept, loss_fn, micro_batch_size=1), reference, atol=1e-7)
    cut = kept.select(batch_keys=[k for k in kept.batch if k != "group_index"])
    cut.batch["group_index"] = torch.arange(len(cut))  # no groups: rows cut one by one
    assert not torch.allclose(gradient(cut, loss_fn, micro_batch_size=1), reference, atol=1e-4)
