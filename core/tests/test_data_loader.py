"""PromptDataLoader: left-padded DataProto batches, seeded order, exact resume."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlcore.data import PromptDataLoader, PromptDataset, load_tokenizer
from rlcore.errors import DataError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("loader")
    tokenizer = load_tokenizer(build_tiny_model(root / "tiny", layers=1))
    data = [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"What is {i} + {i * 7}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(8 * i)},
            "extra_info": {"index": i},
        }
        for i in range(22)
    ]
    pq.write_table(pa.Table.from_pylist(data), root / "train.parquet")
    return PromptDataset(root / "train.parquet", tokenizer, max_prompt_length=64)


def indices(batches):
    return [list(b.non_tensor_batch["index"]) for b in batches]


def test_batches_are_left_padded_with_positions_and_row_fields(dataset):
    loader = PromptDataLoader(dataset, 4, shuffle=False)
    batch = next(iter(loader))
    assert len(batch) == 4
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    lengths = [len(dataset.input_ids[i]) for i in range(4)]
    assert ids.shape == mask.shape == pos.shape == (4, max(lengths))
    assert ids.dtype == mask.dtype == pos.dtype == torch.long
    for row, n in enumerate(lengths):
        width = ids.shape[1]
        assert mask[row].tolist() == [0] * (width - n) + [1] * n
        assert ids[row, width - n :].tolist() == dataset.input_ids[row]
        assert (ids[row, : width - n] == dataset.pad_token_id).all()
        assert pos[row].tolist() == [0] * (width - n) + list(range(n))
    nt = batch.non_tensor_batch
    assert list(nt["index"]) == [0, 1, 2, 3]
    assert nt["reward_model"][2] == {"style": "rule", "ground_truth": "16"}
    assert nt["data_source"][0] == "arithmetic"
    assert nt["raw_prompt"][1] == [{"role": "user", "content": "What is 1 + 7?"}]
    assert nt["raw_prompt_ids"][3] == dataset.input_ids[3]
    assert list(nt["uid"]) == ["train-0-0", "train-0-1", "train-0-2", "train-0-3"]
    # repeat(n) keeps the uid, so the n samples of one prompt form a group
    assert list(batch.repeat(2).non_tensor_batch["uid"][:2]) == ["train-0-0", "train-0-0"]


def test_pad_to_max_length_and_len(dataset):
    loader = PromptDataLoader(dataset, 5, shuffle=False, pad_to_max_length=True)
    assert len(loader) == 4  # 22 // 5, the partial batch dropped
    assert next(iter(loader)).batch["input_ids"].shape == (5, 64)
    val = PromptDataLoader(dataset, 5, shuffle=False, drop_last=False)
    assert len(val) == 5
    assert [len(b) for b in val] == [5, 5, 5, 5, 2]


def test_shuffling_is_seeded_and_new_each_epoch(dataset):
    a = PromptDataLoader(dataset, 5, seed=3)
    b = PromptDataLoader(dataset, 5, seed=3)
    a0, a1 = indices(a), indices(a)
    assert a0 == indices(b)
    assert a0 != a1  # epoch 1 draws a new permutation
    assert a0 != indices(PromptDataLoader(dataset, 5, seed=4))
    flat = sorted(i for batch in a0 for i in batch)
    assert len(flat) == len(set(flat)) == 20  # no repeats within an epoch
    assert a.epoch == 2
    assert next(iter(a)).non_tensor_batch["uid"][0].startswith("train-2-")


def test_resume_mid_epoch_yields_exactly_the_remaining_batches(dataset):
    reference = PromptDataLoader(dataset, 4, seed=7)
    expected = indices(reference) + indices(reference)  # epochs 0 and 1

    first = PromptDataLoader(dataset, 4, seed=7)
    it = iter(first)
    seen = [list(next(it).non_tensor_batch["index"]) for _ in range(2)]
    state = first.state_dict()
    assert state == {"epoch": 0, "position": 2, "seed": 7}

    resumed = PromptDataLoader(dataset, 4, seed=7)
    resumed.load_state_dict(state)
    rest = indices(resumed)
    assert seen + rest == expected[:5]
    assert indices(resumed) == expected[5:]
    uids = [next(iter(PromptDataLoader(dataset, 4, seed=7))).non_tensor_batch["uid"]]
    assert list(uids[0]) == [f"train-0-{i}" for i in expected[0]]


def test_resume_at_an_epoch_boundary_starts_the_next_epoch(dataset):
    reference = PromptDataLoader(dataset, 4, seed=1)
    epoch0, epoch1 = indices(reference), indices(reference)

    first = PromptDataLoader(dataset, 4, seed=1)
    it = iter(first)
    for _ in range(len(first)):
        next(it)  # the trainer checkpoints right after the epoch's last batch
    state = first.state_dict()
    assert state == {"epoch": 1, "position": 0, "seed": 1}

    resumed = PromptDataLoader(dataset, 4, seed=1)
    resumed.load_state_dict(state)
    assert indices(resumed) == epoch1
    assert indices(first) == epoch1  # the original loader continues the same way
    assert epoch0 != epoch1


def test_bad_arguments_and_state_are_data_errors(dataset):
    with pytest.raises(DataError, match="fewer than one batch of 64"):
        PromptDataLoader(dataset, 64)
    with pytest.raises(DataError, match="batch_size must be > 0"):
        PromptDataLoader(dataset, 0)
    loader = PromptDataLoader(dataset, 4)
    with pytest.raises(DataError, match="lacks an integer epoch"):
        loader.load_state_dict({"epoch": 0})
    with pytest.raises(DataError, match=r"position 9 is outside 0\.\.5"):
        loader.load_state_dict({"epoch": 0, "position": 9, "seed": 0})
