"""The asynchronous queue's generations in a checkpoint (``rlcore.trainer.queue_checkpoint``):
written and read back exactly, matched to their prompts, refused when crafted or damaged, and
not used (a warning) when the resumed run's settings differ. No Ray: the run-level resume is
``tests/test_resume_async.py``."""

from __future__ import annotations

import json
import logging
import os
import pickle

import numpy as np
import pytest
import torch

from rlcore.checkpoint import CheckpointError
from rlcore.checkpoint.safe_load import UnsafeCheckpointError, verify_checkpoint, write_manifest
from rlcore.interfaces import SamplingParams
from rlcore.protocol import DataProto
from rlcore.trainer.async_queue import AsyncSpec
from rlcore.trainer.queue_checkpoint import QUEUE_DIR, load_queue, save_queue

SPEC = AsyncSpec(mode="fully_async", max_staleness=2)
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=4, return_log_probs=True)


def _prompts(first: int) -> DataProto:
    ids = torch.arange(first, first + 6).reshape(2, 3)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        non_tensors={"uid": np.array([f"train-0-{first}", f"train-0-{first + 1}"], dtype=object)},
    )


def _gen(rows: int, version: int) -> DataProto:
    g = torch.Generator().manual_seed(version)
    return DataProto.from_dict(
        {
            "responses": torch.randint(0, 50, (rows, 4), generator=g),
            "rollout_log_probs": torch.randn(rows, 4, generator=g),
        },
        non_tensors={
            "weight_version": np.full(rows, version, dtype=np.int64),
            "reward_model": np.array([{"ground_truth": str(i)} for i in range(rows)], dtype=object),
        },
        meta_info={"metrics": {"rollout/weight_version": [float(version)]}},
    )


def _step_dir(tmp_path):
    step = tmp_path / "global_step_3"
    step.mkdir()
    (step / "trainer_state.json").write_text(json.dumps({"step": 3}))
    return step


def _complete(step) -> None:
    write_manifest(step)
    (step / "COMPLETE").write_text(json.dumps({"step": 3}))


def test_the_queue_is_read_back_exactly_and_matched_to_its_prompts(tmp_path):
    step = _step_dir(tmp_path)
    queued = [(_prompts(0), SAMPLING, _gen(4, 1)), (_prompts(6), SAMPLING, _gen(4, 2))]
    save_queue(step, SPEC, queued)
    _complete(step)
    assert verify_checkpoint(step) is None  # every .pt loads with weights_only

    saved = load_queue(step, SPEC)
    assert len(saved) == 2
    for (prompts, _, gen), back in zip(queued, saved, strict=True):
        assert back.fits(prompts, 4, SAMPLING) is None
        for key, tensor in gen.batch.items():
            assert torch.equal(back.gen.batch[key], tensor)
            assert back.gen.batch[key].dtype == tensor.dtype
        assert back.gen.non_tensor_batch["weight_version"].dtype == np.int64
        assert list(back.gen.non_tensor_batch["weight_version"]) == list(
            gen.non_tensor_batch["weight_version"]
        )
        assert list(back.gen.non_tensor_batch["reward_model"]) == list(
            gen.non_tensor_batch["reward_model"]
        )
        assert back.gen.meta_info == gen.meta_info
    index = json.loads((step / QUEUE_DIR / "queue.json").read_text())
    assert [b["weight_version"] for b in index["batches"]] == [1, 2]

    # Another batch of prompts, another row count, other sampling: each said, not used.
    assert "other prompts" in saved[0].fits(_prompts(6), 4, SAMPLING)
    assert "4 rows were generated" in saved[0].fits(_prompts(0), 6, SAMPLING)
    hotter = SamplingParams(temperature=0.7, max_new_tokens=4, return_log_probs=True)
    assert saved[0].fits(_prompts(0), 4, hotter) == "the sampling settings changed"


def test_an_empty_queue_writes_nothing_and_reads_back_empty(tmp_path):
    step = _step_dir(tmp_path)
    save_queue(step, SPEC, [])
    assert not (step / QUEUE_DIR).exists()
    assert load_queue(step, SPEC) == []


def test_another_mode_or_bound_leaves_the_queue_unused_with_a_warning(tmp_path, caplog):
    step = _step_dir(tmp_path)
    save_queue(step, SPEC, [(_prompts(0), SAMPLING, _gen(4, 1))])
    with caplog.at_level(logging.WARNING, logger="rlcore.trainer.queue_checkpoint"):
        assert load_queue(step, AsyncSpec(mode="fully_async", max_staleness=3)) == []
        assert load_queue(step, AsyncSpec(mode="one_step_off", max_staleness=1)) == []
    assert caplog.text.count("generating them again") == 2


def test_a_generation_that_cannot_be_saved_safely_is_left_out_with_a_warning(tmp_path, caplog):
    step = _step_dir(tmp_path)
    gen = _gen(4, 1)
    gen.non_tensor_batch["tool_state"] = np.array([object()] * 4, dtype=object)
    with caplog.at_level(logging.WARNING, logger="rlcore.trainer.queue_checkpoint"):
        save_queue(step, SPEC, [(_prompts(0), SAMPLING, gen)])
    assert not (step / QUEUE_DIR).exists()
    assert "non_tensor_batch['tool_state'][0]" in caplog.text
    assert "a resume generates them again" in caplog.text


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_crafted_or_damaged_queue_is_refused_with_one_line(tmp_path):
    step = _step_dir(tmp_path)
    save_queue(step, SPEC, [(_prompts(0), SAMPLING, _gen(4, 1))])
    batch = step / QUEUE_DIR / "batch_0.pt"
    torch.save({"format": "x", "payload": _RunsCode()}, batch, pickle_protocol=2)
    _complete(step)
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*batch_0\.pt"):
        verify_checkpoint(step)
    with pytest.raises(CheckpointError, match=r"batch_0\.pt.*use an earlier checkpoint") as err:
        load_queue(step, SPEC)
    assert "\n" not in str(err.value)

    batch.write_bytes(pickle.dumps([1, 2], protocol=2))  # not a DataProto file
    with pytest.raises(CheckpointError, match="use an earlier checkpoint"):
        load_queue(step, SPEC)

    index = step / QUEUE_DIR / "queue.json"
    index.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"queue\.json is unreadable \(JSONDecodeError"):
        load_queue(step, SPEC)
    index.write_text(json.dumps({"format": 1, "mode": "fully_async", "max_staleness": 2,
                                 "batches": [{"file": "../../etc/passwd"}]}))  # fmt: skip
    with pytest.raises(CheckpointError, match="outside"):
        load_queue(step, SPEC)


class _Policy:
    """The split policy as the queue sees it (the queue's resume logic is under test, not
    generation): generations are rows tagged with the actor's version, recorded per call."""

    version = 5

    def __init__(self) -> None:
        self.calls: list[str] = []

    def generate_sequences(self, prompts, sampling):
        self.calls.append("sync")
        return _gen(len(prompts), self.version)

    def generate_async(self, prompts, sampling):
        self.calls.append("async")
        gen = _gen(len(prompts), self.version)

        class Done:
            def get(self):
                return gen

        return Done()


class _Ctx:
    n = 2
    sampling = SAMPLING

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    @staticmethod
    def prompts(batch):
        return batch.pop(batch_keys=["input_ids", "attention_mask"])

    def phase(self, name, fn, *args):
        return fn(*args)


def _rows(prompts: DataProto) -> DataProto:
    from rlcore.rl.step import expand_prompts

    return expand_prompts(DataProto.from_dict(dict(prompts.batch)), 2)


@pytest.mark.parametrize("second_fits", [True, False])
def test_the_first_step_after_a_resume_trains_the_saved_generations(tmp_path, second_fits):
    from rlcore.trainer.async_queue import TrajectoryQueue

    step = _step_dir(tmp_path)
    save_queue(
        step, SPEC, [(_prompts(0), SAMPLING, _gen(4, 3)), (_prompts(6), SAMPLING, _gen(4, 4))]
    )
    # The loader gives the same prompts again (or, for the second, other ones).
    ahead = iter([_prompts(6 if second_fits else 12), _prompts(18)])
    policy = _Policy()
    queue = TrajectoryQueue(policy, lambda: next(ahead), SPEC)  # type: ignore[arg-type]
    queue.load_checkpoint(str(step))
    head = _prompts(0)
    out = queue.generate(_Ctx(), head, _rows(head), "gen")  # type: ignore[arg-type]
    # The step trained the saved rows (version 3), not a generation with the restored weights.
    assert out.non_tensor_batch["weight_version"].tolist() == [3] * 4
    # The second saved batch is queued as it was (or generated again when it does not fit),
    # then the queue is topped up to max_staleness = 2 as the unbroken run's was.
    assert policy.calls == (["async"] if second_fits else ["async", "async"])
    assert [item.get().non_tensor_batch["weight_version"][0] for item in queue.pending] == (
        [4, 5] if second_fits else [5, 5]
    )


def test_a_saved_head_for_other_prompts_is_not_used(tmp_path, caplog):
    from rlcore.trainer.async_queue import TrajectoryQueue

    step = _step_dir(tmp_path)
    save_queue(step, SPEC, [(_prompts(0), SAMPLING, _gen(4, 3))])
    policy = _Policy()
    queue = TrajectoryQueue(policy, lambda: None, SPEC)  # type: ignore[arg-type]
    queue.load_checkpoint(str(step))
    other = _prompts(6)
    with caplog.at_level(logging.WARNING, logger="rlcore.trainer.async_queue"):
        out = queue.generate(_Ctx(), other, _rows(other), "gen")  # type: ignore[arg-type]
    assert "not using the checkpoint's queued generations: the loader gave other" in caplog.text
    assert policy.calls == ["sync"]  # generated now, with the restored weights
    assert out.non_tensor_batch["weight_version"].tolist() == [5] * 4
