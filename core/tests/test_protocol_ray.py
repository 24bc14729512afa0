"""DataProto through real Ray CPU actors: round trips keep dtypes (bf16 too) and values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlcore.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto


class ProtoWorker:
    """Undecorated on purpose: tests wrap it with ray.remote where they place it."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def echo(self, data: DataProto) -> DataProto:
        return data

    def score(self, data: DataProto) -> DataProto:
        # In-place writes must be safe on arrival (Ray's buffers are read-only shared memory).
        data.batch["logp"] += 1
        data.batch["score"] = data.batch["input_ids"].float().sum(-1)
        data.non_tensor_batch["worker"] = np.array([self.rank] * len(data), dtype=object)
        data.meta_info["metrics"] = {"loss": float(self.rank), "seen": [len(data)]}
        return data

    def checksum(self, data: DataProto) -> float:
        return float(data.batch["logp"].float().sum())


def make(n: int) -> DataProto:
    ids = torch.arange(n * 4).view(n, 4)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "logp": (ids.float() / 3).bfloat16(),
            "mask": ids % 3 == 0,
            "big": torch.randn(n, 4096),  # 16 KiB rows: out-of-band buffers, not inline
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)], "extra": [{"i": i} for i in range(n)]},
        meta_info={"temperature": 0.7},
    )


@pytest.fixture(scope="module")
def workers(ray_session):
    cls = ray_session.remote(num_cpus=1)(ProtoWorker)
    actors = [cls.remote(rank) for rank in range(2)]
    yield actors
    for a in actors:
        ray_session.kill(a)


def test_echo_round_trip_keeps_everything(ray_session, workers):
    d = make(8)
    for actor in workers:
        out = ray_session.get(actor.echo.remote(d))
        assert out.batch.keys() == d.batch.keys()
        for k in d.batch:
            assert out.batch[k].dtype == d.batch[k].dtype
            assert torch.equal(out.batch[k], d.batch[k])
        assert out.non_tensor_batch["uid"].tolist() == d.non_tensor_batch["uid"].tolist()
        assert out.non_tensor_batch["extra"].tolist() == d.non_tensor_batch["extra"].tolist()
        assert out.meta_info == d.meta_info
        out.batch["big"][0, 0] = 123.0  # arrived tensors are writable on the driver too


def test_dispatch_like_chunk_pad_concat_across_two_actors(ray_session, workers):
    d = make(7)
    padded, pad = pad_dataproto_to_divisor(d, len(workers))
    parts = padded.chunk(len(workers))
    outs = ray_session.get([w.score.remote(p) for w, p in zip(workers, parts)])
    merged = unpad_dataproto(DataProto.concat(outs), pad)
    assert len(merged) == 7
    assert merged.batch["logp"].dtype == torch.bfloat16
    assert torch.equal(merged.batch["logp"], d.batch["logp"] + 1)
    assert torch.equal(merged.batch["score"], d.batch["input_ids"].float().sum(-1))
    assert merged.non_tensor_batch["worker"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert merged.meta_info["temperature"] == 0.7
    assert merged.meta_info["metrics"] == {"loss": [0.0, 1.0], "seen": [4, 4]}
    # the driver's batch was sent, not shared: the workers' in-place += did not reach it
    assert torch.equal(d.batch["logp"], make(7).batch["logp"])


def test_in_place_write_does_not_corrupt_a_shared_object(ray_session, workers):
    d = make(4)
    ref = ray_session.put(d)  # one stored object, read by both actors
    expected = float(d.batch["logp"].float().sum())
    ray_session.get(workers[0].score.remote(ref))
    assert ray_session.get(workers[1].checksum.remote(ref)) == expected
