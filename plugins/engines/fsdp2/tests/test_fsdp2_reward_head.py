"""FSDP2Engine as a reward model (``spec.reward_head``), one process (a private 1-rank gloo
group): the score of each row is the sequence classifier's head at its last attended token,
as transformers computes it row by row, whatever the micro-batching, even for a row whose
last token is the pad id (where transformers' own pooling looks elsewhere)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlcore.interfaces import EngineSpec
from rlcore.protocol import DataProto
from rlcore_fsdp2.engine import FSDP2Engine

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_reward_model

    root = tmp_path_factory.mktemp("rm")
    return str(build_tiny_reward_model(root / "rm", hidden=64, heads=2, kv_heads=1, seed=1))


@pytest.fixture(scope="module", autouse=True)
def _private_process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def rows(pad_id: int) -> DataProto:
    """Left-padded rows of lengths 3..8; the third ends with the pad id itself."""
    g = torch.Generator().manual_seed(0)
    lengths = [5, 8, 4, 3, 7, 6, 8]
    T = max(lengths)
    ids = torch.full((len(lengths), T), pad_id)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, T - n :] = torch.randint(3, 250, (n,), generator=g)
        mask[i, T - n :] = 1
    ids[2, -1] = pad_id
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}
    )


def reference(path: str, batch: DataProto) -> torch.Tensor:
    """transformers' own score, one unpadded row at a time (its pooling: the last token)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for ids, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"]):
            keep = ids[mask.bool()].unsqueeze(0)
            model.config.pad_token_id = None  # one row: no pooling by pad id
            out.append(model(input_ids=keep).logits[0, 0])
    return torch.stack(out)


@pytest.mark.parametrize("micro", [{"micro_batch_size": 3}, {"max_tokens_per_micro_batch": 20}])
def test_rm_scores_match_transformers_row_by_row(rm_path, micro):
    micro = {"micro_batch_size": None, **micro}
    spec = EngineSpec(role="rm", model_path=rm_path, reward_head=True, optim=None, **micro)
    engine = FSDP2Engine(spec, FSDP2Engine.Config())
    batch = rows(pad_id=0)
    scores = engine.compute_rm_score(batch)
    assert scores.shape == (7,)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, reference(rm_path, batch), atol=1e-5, rtol=1e-5)


def test_an_engine_without_a_reward_head_refuses_rm_scores(tmp_path):
    from rlcore.testing.tiny_model import build_tiny_model

    lm = build_tiny_model(tmp_path / "lm", hidden=64, heads=2, kv_heads=1)
    engine = FSDP2Engine(EngineSpec(role="ref", model_path=str(lm)), FSDP2Engine.Config())
    with pytest.raises(NotImplementedError, match="cannot serve the reward_model role"):
        engine.compute_rm_score(rows(pad_id=0))
