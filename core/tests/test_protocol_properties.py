"""Property tests (hypothesis): round trips of chunk/concat, pad/unpad, repeat, select/union."""

from __future__ import annotations

import pickle

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcore.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

SETTINGS = settings(max_examples=30, deadline=None)

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16]


@st.composite
def dataprotos(draw, min_rows: int = 0, max_rows: int = 12) -> DataProto:
    n = draw(st.integers(min_rows, max_rows))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    batch = {}
    for i in range(draw(st.integers(0, 3))):
        dtype = draw(st.sampled_from(DTYPES))
        shape = (n, *draw(st.lists(st.integers(1, 4), max_size=2)))
        batch[f"t{i}"] = (torch.randn(shape, generator=gen) * 10).to(dtype)
    non_tensors = {}
    for i in range(draw(st.integers(0 if batch else 1, 2))):
        values = draw(
            st.lists(
                st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3)),
                min_size=n,
                max_size=n,
            )
        )
        non_tensors[f"n{i}"] = values
    meta = draw(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(), max_size=2))
    return DataProto.from_dict(tensors=batch, non_tensors=non_tensors, meta_info=meta)


def rows(d: DataProto) -> list[tuple]:
    """Each row as comparable Python values, in order."""
    out = []
    for i in range(len(d)):
        item = d[i]
        out.append(
            tuple(item.batch[k].float().tolist() for k in sorted(item.batch))
            + tuple(repr(item.non_tensor_batch[k]) for k in sorted(item.non_tensor_batch))
        )
    return out


def same(a: DataProto, b: DataProto) -> bool:
    if a.batch.keys() != b.batch.keys() or a.non_tensor_batch.keys() != b.non_tensor_batch.keys():
        return False
    if any(a.batch[k].dtype != b.batch[k].dtype for k in a.batch):
        return False
    return len(a) == len(b) and rows(a) == rows(b) and a.meta_info == b.meta_info


@SETTINGS
@given(dataprotos(), st.integers(1, 6))
def test_chunk_concat_round_trip(d, k):
    padded, pad = pad_dataproto_to_divisor(d, k) if len(d) else (d, 0)
    if len(padded) == 0:
        return
    parts = padded.chunk(k)
    assert len(parts) == k
    assert len({len(p) for p in parts}) == 1
    assert same(unpad_dataproto(DataProto.concat(parts), pad), d)


@SETTINGS
@given(dataprotos(), st.integers(1, 5))
def test_split_concat_round_trip(d, size):
    if len(d) == 0:
        assert d.split(size) == []
        return
    parts = d.split(size)
    assert all(len(p) == size for p in parts[:-1])
    assert same(DataProto.concat(parts), d)


@SETTINGS
@given(dataprotos(min_rows=1), st.integers(1, 9))
def test_pad_unpad_round_trip(d, k):
    padded, pad = pad_dataproto_to_divisor(d, k)
    assert len(padded) % k == 0
    assert 0 <= pad < k
    assert rows(padded)[len(d) :] == [rows(d)[i % len(d)] for i in range(pad)]
    assert same(unpad_dataproto(padded, pad), d)


@SETTINGS
@given(dataprotos(), st.integers(1, 4), st.booleans())
def test_repeat(d, k, interleave):
    r = d.repeat(k, interleave=interleave)
    assert len(r) == k * len(d)
    base = rows(d)
    expected = [row for row in base for _ in range(k)] if interleave else base * k
    assert rows(r) == expected
    if interleave and len(d):
        # every group of k consecutive rows is one original row
        assert same(r[::k], d)


@SETTINGS
@given(dataprotos(min_rows=1), st.data())
def test_select_union_round_trip(d, data):
    keys = sorted(d.batch)
    nkeys = sorted(d.non_tensor_batch)
    left_b = data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    left_n = data.draw(st.lists(st.sampled_from(nkeys), unique=True) if nkeys else st.just([]))
    left = d.select(batch_keys=left_b, non_tensor_batch_keys=left_n, meta_info_keys=[])
    # the right side overlaps the left on shared keys (equal values: allowed)
    right = d.select(
        batch_keys=[k for k in keys if k not in left_b or data.draw(st.booleans())],
        non_tensor_batch_keys=[k for k in nkeys if k not in left_n or data.draw(st.booleans())],
    )
    assert same(left | right, d)


@SETTINGS
@given(dataprotos(), st.data())
def test_index_matches_select_idxs_and_pickle(d, data):
    n = len(d)
    idx = data.draw(st.lists(st.integers(-n, n - 1), max_size=10)) if n else []
    picked = d[idx]
    assert rows(picked) == [rows(d)[i] for i in idx]
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    assert rows(d[mask]) == [r for r, m in zip(rows(d), mask) if m]
    assert same(pickle.loads(pickle.dumps(d, protocol=5)), d)
