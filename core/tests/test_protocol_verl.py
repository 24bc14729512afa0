"""DataProto's verl API beyond the basics: padding switches, sample-level repeat, column chunks,
folding rows, TensorDict conversion, the union cycle guard and the error type verl code
catches. Several cases are ports of verl's tests/test_protocol_on_cpu.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rlcore.errors import DataProtoError
from rlcore.protocol import DataProto, DataProtoConfig, fold_batch_dim, unfold_batch_dim


def three() -> DataProto:
    return DataProto.from_dict(
        tensors={"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])},
        non_tensors={"labels": ["a", "b", "c"]},
        meta_info={"info": "test_info"},
    )


# --- errors -----------------------------------------------------------------------------


def test_dataproto_error_is_also_an_assertion_error():
    with pytest.raises(AssertionError):  # what ported verl code catches
        three().chunk(2)
    with pytest.raises(ValueError, match="cannot chunk 3 rows into 2"):
        three().chunk(2)


# --- union cycle guard ------------------------------------------------------------------


def _self_referencing(n: int) -> np.ndarray:
    arr = np.empty(n, dtype=object)
    for i in range(n):
        arr[i] = arr if i == 0 else i
    return arr


def test_union_with_self_referencing_object_arrays_terminates():
    a = DataProto.from_dict(non_tensors={"x": _self_referencing(3)})
    b = DataProto.from_dict(non_tensors={"x": _self_referencing(3)})
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(200)  # an unguarded recursion fails fast here
        a.union(b)
    finally:
        sys.setrecursionlimit(limit)
    assert a.non_tensor_batch["x"] is b.non_tensor_batch["x"]
    # a real difference next to the cycle is still a conflict
    c = _self_referencing(3)
    c[2] = 99
    with pytest.raises(DataProtoError, match=r"union conflict: non_tensor_batch\['x'\]"):
        DataProto.from_dict(non_tensors={"x": _self_referencing(3)}).union(
            DataProto.from_dict(non_tensors={"x": c})
        )


def test_union_with_self_referencing_lists_in_meta_info():
    la: list = [1]
    la.append(la)
    lb: list = [1]
    lb.append(lb)
    a = DataProto(meta_info={"m": la})
    a.union(DataProto(meta_info={"m": lb}))
    lc: list = [2]
    lc.append(lc)
    with pytest.raises(DataProtoError, match="meta_info"):
        a.union(DataProto(meta_info={"m": lc}))


# --- padding API --------------------------------------------------------------------------


def test_auto_padding_marks_the_proto_and_allows_uneven_chunks():
    d = DataProto.from_dict(tensors={"x": torch.arange(5)}, auto_padding=True)
    assert d.is_padding_enabled()
    assert d.meta_info == {DataProtoConfig.auto_padding_key: True}
    parts = d.chunk(3)
    assert [p.batch["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4]]
    assert DataProto.concat(parts).batch["x"].tolist() == [0, 1, 2, 3, 4]
    s = DataProto.from_single_dict({"x": torch.arange(4), "u": np.arange(4)}, auto_padding=True)
    assert s.is_padding_enabled()
    assert [len(p) for p in s.chunk(3)] == [2, 1, 1]  # always `chunks` parts here
    assert not three().is_padding_enabled()


def test_dataproto_config_switch_and_env(monkeypatch):
    monkeypatch.delenv("VERL_AUTO_PADDING", raising=False)
    assert DataProtoConfig.auto_padding is False
    try:
        DataProtoConfig.auto_padding = True
        assert three().is_padding_enabled()
        assert [len(p) for p in three().chunk(2)] == [2, 1]
    finally:
        DataProtoConfig.auto_padding = False
    assert not three().is_padding_enabled()
    monkeypatch.setenv("VERL_AUTO_PADDING", "TRUE")
    assert DataProtoConfig.auto_padding is True
    monkeypatch.setenv("VERL_AUTO_PADDING", "0")
    assert not three().is_padding_enabled()
    # RLCORE_AUTO_PADDING is trainer.auto_padding of a run (core/tests/test_config_knobs.py).
    with pytest.raises(DataProtoError, match="must be a bool"):
        DataProtoConfig.auto_padding = "yes"  # type: ignore[assignment]


def test_padding_in_place_with_first_or_last_row():
    d = three()
    d.padding(2)
    assert d.batch["obs"].tolist() == [[1, 2], [3, 4], [5, 6], [5, 6], [5, 6]]
    assert d.non_tensor_batch["labels"].tolist() == ["a", "b", "c", "c", "c"]
    d = three()
    d.padding(1, "first")
    assert d.non_tensor_batch["labels"].tolist() == ["a", "b", "c", "a"]
    assert d.meta_info == {"info": "test_info"}
    d.padding(0)
    assert len(d) == 4
    with pytest.raises(DataProtoError, match="empty DataProto"):
        DataProto().padding(1)


def test_num_batch_dims_other_than_one_is_refused():
    with pytest.raises(DataProtoError, match="num_batch_dims=2 is not supported"):
        DataProto.from_dict(tensors={"x": torch.zeros(2, 3)}, num_batch_dims=2)


# --- repeats and column chunks (ported from verl) -----------------------------------------


def test_sample_level_repeat():
    data = three()
    out = data.sample_level_repeat(repeat_times=[3, 1, 2])
    assert out.batch["obs"].tolist() == [[1, 2], [1, 2], [1, 2], [3, 4], [5, 6], [5, 6]]
    assert out.non_tensor_batch["labels"].tolist() == ["a", "a", "a", "b", "c", "c"]
    assert out.meta_info == {"info": "test_info"}
    for counts in (torch.tensor([1, 2, 3]), np.array([1, 2, 3]), (1, 2, 3)):
        out = data.sample_level_repeat(counts)
        assert out.non_tensor_batch["labels"].tolist() == ["a", "b", "b", "c", "c", "c"]
        assert out.batch["obs"].tolist() == [[1, 2], [3, 4], [3, 4], [5, 6], [5, 6], [5, 6]]
    assert data.sample_level_repeat([0, 1, 0]).non_tensor_batch["labels"].tolist() == ["b"]
    with pytest.raises(DataProtoError, match=r"one non-negative count per row \(3\)"):
        data.sample_level_repeat([1, 2])
    with pytest.raises(DataProtoError, match="1-D sequence of ints"):
        data.sample_level_repeat([1.5, 1, 1])


def test_unfold_column_chunks():
    obs1 = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    obs2 = torch.tensor([[1, 2], [5, 6], [9, 10]])
    data = DataProto.from_dict(
        tensors={"obs1": obs1, "obs2": obs2},
        non_tensors={"labels": ["a", "b", "c"]},
        meta_info={"name": "abc"},
    )
    ret = data.unfold_column_chunks(2, split_keys=["obs1"])
    assert ret.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    assert ret.batch["obs2"].tolist() == [[1, 2], [1, 2], [5, 6], [5, 6], [9, 10], [9, 10]]
    assert ret.non_tensor_batch["labels"].tolist() == ["a", "a", "b", "b", "c", "c"]
    assert ret.meta_info == {"name": "abc"}

    # a 2-D object array is split too (verl builds one from a list of lists; pass it as such)
    labels = np.array([["a1", "a2"], ["b1", "b2"], ["c1", "c2"]], dtype=object)
    data = DataProto.from_dict(tensors={"obs1": obs1}, non_tensors={"labels": labels})
    ret = data.unfold_column_chunks(2, split_keys=["obs1", "labels"])
    assert ret.non_tensor_batch["labels"].tolist() == [
        ["a1"],
        ["a2"],
        ["b1"],
        ["b2"],
        ["c1"],
        ["c2"],
    ]

    # 3-D tensors: dim 1 is split, the rest kept
    obs3 = torch.arange(24).view(3, 4, 2)
    ret = DataProto.from_dict(tensors={"o": obs3}).unfold_column_chunks(2, split_keys=["o"])
    assert ret.batch["o"].shape == (6, 2, 2)
    assert torch.equal(ret.batch["o"][1], obs3[0, 2:])

    # no split keys: every key repeated (verl fails on non-tensors here)
    ret = three().unfold_column_chunks(2)
    assert ret.non_tensor_batch["labels"].tolist() == ["a", "a", "b", "b", "c", "c"]
    with pytest.raises(DataProtoError, match="dim 1 must divide into 3 parts"):
        data.unfold_column_chunks(3, split_keys=["obs1"])
    with pytest.raises(DataProtoError, match=r"no keys \['nope'\]"):
        data.unfold_column_chunks(2, split_keys=["nope"])


def test_fold_and_unfold_batch_dim():
    d = DataProto.from_dict(
        tensors={"x": torch.arange(12).view(6, 2)},
        non_tensors={"u": [f"u{i}" for i in range(6)]},
        meta_info={"k": 1},
    )
    folded = fold_batch_dim(d, 2)
    assert len(folded) == 2
    assert folded.batch["x"].shape == (2, 3, 2)
    assert folded.non_tensor_batch["u"].shape == (2, 3)
    assert folded.non_tensor_batch["u"][1].tolist() == ["u3", "u4", "u5"]
    assert folded.meta_info == {"k": 1}
    back = unfold_batch_dim(folded, batch_dims=2)
    assert torch.equal(back.batch["x"], d.batch["x"])
    assert back.non_tensor_batch["u"].tolist() == d.non_tensor_batch["u"].tolist()
    assert torch.equal(d.fold_batch_dim(3).unfold_batch_dim().batch["x"], d.batch["x"])
    with pytest.raises(DataProtoError, match="6 rows do not fold into 4"):
        fold_batch_dim(d, 4)
    with pytest.raises(DataProtoError, match="must share their first 2 dims"):
        unfold_batch_dim(d, batch_dims=2)  # u is 1-D


# --- TensorDict ------------------------------------------------------------------------


def test_to_and_from_tensordict():
    tensordict = pytest.importorskip("tensordict", reason="tensordict is optional")
    obs = torch.tensor([1, 2, 3, 4, 5, 6])
    labels = ["a", "b", "c", "d", "e", "f"]
    nested = [[], [0.5], {"acc": 1.0}, [{"role": "user"}], None, "x"]
    data = DataProto.from_dict(
        tensors={"obs": obs},
        non_tensors={"labels": labels, "nested": nested},
        meta_info={"name": "abdce"},
    )
    out = data.to_tensordict()
    assert isinstance(out, tensordict.TensorDict)
    assert torch.equal(out["obs"], obs)
    assert out["labels"] == labels  # verl's test reads it back the same way
    assert out["name"] == "abdce"
    back = DataProto.from_tensordict(out, meta_info={"extra": 2})
    assert torch.equal(back.batch["obs"], obs)
    assert back.non_tensor_batch["labels"].tolist() == labels
    assert back.non_tensor_batch["nested"].tolist() == nested
    assert back.meta_info == {"name": "abdce", "extra": 2}
    clash = DataProto.from_dict(tensors={"k": obs}, meta_info={"k": 1})
    with pytest.raises(DataProtoError, match=r"keys \['k'\] appear in more than one part"):
        clash.to_tensordict()
    with pytest.raises(DataProtoError, match="needs a TensorDict"):
        DataProto.from_tensordict({"obs": obs})
