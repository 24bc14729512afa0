"""Unit tests for DataProto: every method, its verl semantics and its errors."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import rlcore
from rlcore.errors import DataProtoError
from rlcore.protocol import (
    DataProto,
    DataProtoIndexError,
    DataProtoItem,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from rlcore.protocol.helpers import _values_equal


def make(n: int = 6, meta: dict | None = None) -> DataProto:
    ids = torch.arange(n * 3).view(n, 3)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "logp": (ids.float() / 7).bfloat16(),
            "mask": ids % 2 == 0,
        },
        non_tensors={
            "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
            "extra": [{"i": i, "tags": [i] * (i % 3)} for i in range(n)],
        },
        meta_info=meta if meta is not None else {"temperature": 1.0},
    )


def assert_equal(a: DataProto, b: DataProto) -> None:
    assert a.batch.keys() == b.batch.keys()
    for k in a.batch:
        assert a.batch[k].dtype == b.batch[k].dtype, k
        assert torch.equal(a.batch[k], b.batch[k]), k
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.non_tensor_batch:
        assert a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist(), k
    assert _values_equal(a.meta_info, b.meta_info)


# --- construction ------------------------------------------------------------------------


def test_lazy_export_from_rlcore():
    assert rlcore.DataProto is DataProto


def test_from_dict_converts_lists_to_one_dim_object_arrays():
    d = DataProto.from_dict(non_tensors={"pairs": [[1, 2], [3, 4]]})
    arr = d.non_tensor_batch["pairs"]
    assert arr.dtype == object
    assert arr.shape == (2,)
    assert arr[1] == [3, 4]
    assert len(d) == 2


def test_from_single_dict_sorts_by_type():
    d = DataProto.from_single_dict(
        {"x": torch.zeros(4, 2), "s": np.array(list("abcd"), dtype=object)}, meta_info={"m": 1}
    )
    assert list(d.batch) == ["x"]
    assert list(d.non_tensor_batch) == ["s"]
    assert d.meta_info == {"m": 1}
    with pytest.raises(DataProtoError, match="'bad' is a list"):
        DataProto.from_single_dict({"bad": [1, 2]})  # type: ignore[dict-item]


def test_length_from_batch_non_tensors_or_empty():
    assert len(make(5)) == 5
    assert len(DataProto(non_tensor_batch={"s": np.arange(3)})) == 3
    assert len(DataProto()) == 0
    assert DataProto(batch=None).batch == {}


def test_length_mismatch_is_an_error_naming_both_keys():
    with pytest.raises(DataProtoError, match=r"batch\['b'\] has 3 rows but batch\['a'\] has 2"):
        DataProto(batch={"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['s'\] has 1 rows"):
        DataProto(batch={"a": torch.zeros(2)}, non_tensor_batch={"s": ["x"]})
    with pytest.raises(DataProtoError, match="0-dimensional"):
        DataProto(batch={"a": torch.tensor(1.0)})
    with pytest.raises(DataProtoError, match="torch tensors only"):
        DataProto(batch={"a": np.zeros(2)})  # type: ignore[dict-item]
    with pytest.raises(DataProtoError, match="numpy array or list"):
        DataProto(non_tensor_batch={"a": "abc"})


def test_check_consistency_after_direct_mutation():
    d = make(4)
    d.batch["bad"] = torch.zeros(5)
    with pytest.raises(DataProtoError, match="5 rows"):
        d.check_consistency()


def test_repr_shows_keys_shapes_and_len():
    r = repr(make(4))
    assert "len=4" in r
    assert "input_ids: (4, 3) int64" in r
    assert "logp: (4, 3) bfloat16" in r
    assert "uid: (4,) object" in r
    assert "temperature" in r


# --- indexing ----------------------------------------------------------------------------


def test_int_index_returns_item_row():
    d = make(4)
    item = d[2]
    assert isinstance(item, DataProtoItem)
    assert torch.equal(item.batch["input_ids"], torch.tensor([6, 7, 8]))
    assert item.non_tensor_batch["uid"] == "u2"
    assert item.meta_info == {"temperature": 1.0}
    assert d[-1].non_tensor_batch["uid"] == "u3"
    assert d[np.int64(1)].non_tensor_batch["uid"] == "u1"


def test_int_index_out_of_range_is_index_error_and_iteration_works():
    d = make(3)
    with pytest.raises(DataProtoIndexError):
        d[3]
    with pytest.raises(IndexError):
        d[-4]
    assert [row.non_tensor_batch["uid"] for row in d] == ["u0", "u1", "u2"]


def test_slice_is_a_view_and_keeps_meta():
    d = make(6)
    s = d[1:5:2]
    assert s.non_tensor_batch["uid"].tolist() == ["u1", "u3"]
    assert torch.equal(s.batch["input_ids"][:, 0], torch.tensor([3, 9]))
    assert s.meta_info == d.meta_info
    assert s.batch["input_ids"].data_ptr() == d.batch["input_ids"][1].data_ptr()
    assert d[::-1].non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(5, -1, -1)]
    with pytest.raises(DataProtoError, match="zero"):
        d.slice(0, 4, 0)


@pytest.mark.parametrize(
    "index",
    [
        [0, 2, 5],
        np.array([0, 2, 5]),
        torch.tensor([0, 2, 5]),
        [0, -4, -1],
        np.array([True, False, True, False, False, True]),
        torch.tensor([True, False, True, False, False, True]),
        [True, False, True, False, False, True],
    ],
)
def test_index_arrays_and_masks(index):
    picked = make(6)[index]
    assert isinstance(picked, DataProto)
    assert picked.non_tensor_batch["uid"].tolist() == ["u0", "u2", "u5"]
    assert torch.equal(picked.batch["input_ids"][:, 0], torch.tensor([0, 6, 15]))
    assert picked.batch["logp"].dtype == torch.bfloat16


def test_bad_indices():
    d = make(4)
    with pytest.raises(DataProtoError, match="mask has shape"):
        d[np.array([True, False])]
    with pytest.raises(DataProtoIndexError):
        d[[0, 4]]
    with pytest.raises(DataProtoError, match="1-D integer"):
        d[np.array([0.5, 1.0])]
    assert len(d[[]]) == 0


# --- keys --------------------------------------------------------------------------------


def test_select_keeps_named_keys_shares_tensors():
    d = make(4, meta={"a": 1, "b": [1]})
    s = d.select(batch_keys=["input_ids"], non_tensor_batch_keys=["uid"], meta_info_keys=["b"])
    assert list(s.batch) == ["input_ids"]
    assert list(s.non_tensor_batch) == ["uid"]
    assert s.meta_info == {"b": [1]}
    assert s.batch["input_ids"] is d.batch["input_ids"]
    assert s.meta_info["b"] is d.meta_info["b"]
    deep = d.select(meta_info_keys="b", deepcopy=True)
    assert deep.meta_info["b"] is not d.meta_info["b"]
    assert d.select().batch.keys() == d.batch.keys()  # None keeps all
    with pytest.raises(DataProtoError, match=r"batch has no keys \['nope'\]"):
        d.select(batch_keys=["nope"])


def test_pop_removes_and_returns():
    d = make(4)
    p = d.pop(batch_keys=["logp"], non_tensor_batch_keys=["extra"], meta_info_keys=["temperature"])
    assert list(p.batch) == ["logp"]
    assert list(p.non_tensor_batch) == ["extra"]
    assert p.meta_info == {"temperature": 1.0}
    assert "logp" not in d.batch
    assert "extra" not in d.non_tensor_batch
    assert d.meta_info == {}
    assert len(d.pop()) == 0


def test_failed_pop_changes_nothing():
    d = make(4)
    with pytest.raises(DataProtoError, match="non_tensor_batch has no keys"):
        d.pop(batch_keys=["logp"], non_tensor_batch_keys=["missing"])
    assert "logp" in d.batch


def test_rename():
    d = make(3)
    ids = d.batch["input_ids"]
    assert d.rename("input_ids", "tokens") is d
    assert d.batch["tokens"] is ids
    assert "input_ids" not in d.batch
    d.rename(["tokens", "logp"], ["logp", "tokens"])  # a swap is fine
    assert d.batch["logp"] is ids
    with pytest.raises(DataProtoError, match="would overwrite"):
        d.rename("logp", "mask")
    with pytest.raises(DataProtoError, match="2 old keys but 1"):
        d.rename(["logp", "mask"], ["x"])
    with pytest.raises(DataProtoError, match="no keys"):
        d.rename("zzz", "y")


def test_union_adds_keys_in_place_and_accepts_equal_shared_keys():
    d = make(4)
    other = DataProto.from_dict(
        tensors={"input_ids": d.batch["input_ids"].clone(), "adv": torch.ones(4)},
        non_tensors={"uid": d.non_tensor_batch["uid"].copy(), "score": np.arange(4.0)},
        meta_info={"temperature": 1.0, "step": 3},
    )
    assert d.union(other) is d
    assert set(d.batch) == {"input_ids", "logp", "mask", "adv"}
    assert set(d.non_tensor_batch) == {"uid", "extra", "score"}
    assert d.meta_info == {"temperature": 1.0, "step": 3}


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (DataProto(batch={"input_ids": torch.zeros(4, 3, dtype=torch.int64)}), "batch"),
        (DataProto(non_tensor_batch={"uid": ["a", "b", "c", "d"]}), "non_tensor_batch"),
        (DataProto(meta_info={"temperature": 0.5}), "meta_info"),
        (DataProto(batch={"z": torch.zeros(3)}), "4 and 3 rows"),
    ],
)
def test_union_conflicts_raise_and_change_nothing(other, match):
    d = make(4)
    before = copy.deepcopy(d)
    with pytest.raises(DataProtoError, match=match):
        d.union(other)
    assert_equal(d, before)


def test_union_treats_nan_as_equal_and_nested_values():
    x = torch.tensor([float("nan"), 1.0])
    a = DataProto(batch={"x": x}, non_tensor_batch={"o": [np.array([1.0, np.nan]), {"k": [1]}]})
    b = DataProto(
        batch={"x": x.clone()}, non_tensor_batch={"o": [np.array([1.0, np.nan]), {"k": [1]}]}
    )
    a.union(b)
    c = DataProto(non_tensor_batch={"o": [np.array([1.0, 2.0]), {"k": [1]}]})
    with pytest.raises(DataProtoError, match="conflict"):
        a.union(c)


def test_or_and_ior():
    d = make(4)
    extra = DataProto(batch={"adv": torch.ones(4)}, meta_info={"step": 1})
    e = d | extra
    assert "adv" in e.batch
    assert "adv" not in d.batch
    assert "step" not in d.meta_info
    d |= extra
    assert "adv" in d.batch
    assert d.meta_info["step"] == 1


# --- splitting and joining ---------------------------------------------------------------


def test_chunk_concat_round_trip():
    d = make(6)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert parts[1].non_tensor_batch["uid"].tolist() == ["u2", "u3"]
    assert_equal(DataProto.concat(parts), d)


def test_chunk_uneven_errors_with_hint():
    with pytest.raises(DataProtoError, match="pad_dataproto_to_divisor"):
        make(5).chunk(2)
    with pytest.raises(DataProtoError, match="positive"):
        make(4).chunk(0)


def test_chunk_of_non_tensor_only_dataproto():
    d = DataProto(non_tensor_batch={"s": list("abcd")})
    assert [p.non_tensor_batch["s"].tolist() for p in d.chunk(2)] == [["a", "b"], ["c", "d"]]


def test_split_last_part_shorter():
    parts = make(5).split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert parts[2].non_tensor_batch["uid"].tolist() == ["u4"]
    with pytest.raises(DataProtoError):
        make(5).split(0)


def test_concat_merges_metrics_per_name():
    parts = make(4).chunk(2)
    parts[0].meta_info = {"temperature": 1.0, "metrics": {"loss": 0.5, "lr": 1e-6}}
    parts[1].meta_info = {"temperature": 1.0, "metrics": [{"loss": 0.25}, {"loss": [0.1, 0.2]}]}
    out = DataProto.concat(parts)
    assert out.meta_info["temperature"] == 1.0
    assert out.meta_info["metrics"] == {"loss": [0.5, 0.25, 0.1, 0.2], "lr": [1e-6]}


def test_concat_errors():
    with pytest.raises(DataProtoError, match="at least one"):
        DataProto.concat([])
    a, b = make(4).chunk(2)
    b.meta_info = {"temperature": 0.7}
    with pytest.raises(DataProtoError, match="meta_info\\['temperature'\\]"):
        DataProto.concat([a, b])
    c = make(2).pop(batch_keys=["logp"])
    with pytest.raises(DataProtoError, match="batch keys"):
        DataProto.concat([make(2), c])
    bad = make(2, meta={"metrics": 3})
    with pytest.raises(DataProtoError, match="metrics"):
        DataProto.concat([bad])


def test_repeat_interleave_and_tile():
    d = make(3)
    r = d.repeat(repeat_times=2, interleave=True)
    assert r.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    assert torch.equal(r.batch["input_ids"][:, 0], torch.tensor([0, 0, 3, 3, 6, 6]))
    t = d.repeat(2, interleave=False)
    assert t.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2"] * 2
    assert t.batch["logp"].shape == (6, 3)
    with pytest.raises(DataProtoError):
        d.repeat(0)


def test_reorder_in_place():
    d = make(4)
    d.reorder(torch.tensor([3, 1, 0, 2]))
    assert d.non_tensor_batch["uid"].tolist() == ["u3", "u1", "u0", "u2"]
    assert torch.equal(d.batch["input_ids"][:, 0], torch.tensor([9, 3, 0, 6]))


def test_make_iterator_seeded_shuffle_per_epoch():
    d = make(8, meta={"k": "v"})

    def run(seed):
        return [
            mb.non_tensor_batch["uid"].tolist()
            for mb in d.make_iterator(
                mini_batch_size=4, epochs=2, seed=seed, dataloader_kwargs={"shuffle": True}
            )
        ]

    a = run(0)
    assert a == run(0)
    assert len(a) == 4
    assert all(len(mb) == 4 for mb in a)
    assert sorted(a[0] + a[1]) == sorted(a[2] + a[3]) == sorted(f"u{i}" for i in range(8))
    assert a[:2] != a[2:]  # epochs are reshuffled (fixed seed: deterministic)
    in_order = [["u0", "u1", "u2", "u3"], ["u4", "u5", "u6", "u7"]]
    mbs = list(d.make_iterator(4, 1, dataloader_kwargs={"shuffle": False}))
    assert [m.non_tensor_batch["uid"].tolist() for m in mbs] == in_order
    # verl's default (a torch DataLoader's): no shuffle
    default = [m.non_tensor_batch["uid"].tolist() for m in d.make_iterator(4, 2, seed=3)]
    assert default == in_order * 2
    assert mbs[0].meta_info is d.meta_info


def test_make_iterator_errors():
    d = make(6)
    with pytest.raises(DataProtoError, match="do not divide"):
        d.make_iterator(4, 1)
    with pytest.raises(DataProtoError, match="unsupported"):
        d.make_iterator(3, 1, dataloader_kwargs={"num_workers": 2})


def test_pad_and_unpad():
    d = make(5)
    padded, pad = pad_dataproto_to_divisor(d, 4)
    assert pad == 3
    assert len(padded) == 8
    # verl: the padding repeats rows from the start
    assert padded.non_tensor_batch["uid"].tolist()[5:] == ["u0", "u1", "u2"]
    assert padded.meta_info == d.meta_info
    assert_equal(unpad_dataproto(padded, pad), d)
    same, zero = pad_dataproto_to_divisor(d, 5)
    assert zero == 0
    assert same is d
    assert unpad_dataproto(d, 0) is d


def test_pad_more_than_length_cycles():
    d = make(2)
    padded, pad = pad_dataproto_to_divisor(d, 7)
    assert pad == 5
    assert padded.non_tensor_batch["uid"].tolist() == ["u0", "u1"] * 3 + ["u0"]


def test_pad_errors():
    with pytest.raises(DataProtoError):
        pad_dataproto_to_divisor(make(2), 0)
    with pytest.raises(DataProtoError, match="pad_size"):
        unpad_dataproto(make(2), 3)


def test_to_device_moves_in_place():
    d = make(2)
    assert d.to("cpu") is d
    assert d.to(torch.device("meta")).batch["input_ids"].device.type == "meta"


# --- copies, pickling, files ---------------------------------------------------------------


def test_copy_and_deepcopy():
    d = make(3)
    shallow = copy.copy(d)
    shallow.batch["new"] = torch.zeros(3)
    assert "new" not in d.batch
    assert shallow.batch["input_ids"] is d.batch["input_ids"]
    deep = copy.deepcopy(d)
    deep.batch["input_ids"][0, 0] = 99
    deep.non_tensor_batch["extra"][0]["i"] = 99
    assert d.batch["input_ids"][0, 0] == 0
    assert d.non_tensor_batch["extra"][0]["i"] == 0


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_round_trip_all_dtypes(protocol):
    tensors = {
        name: torch.arange(12).view(4, 3).to(dtype)
        for name, dtype in [
            ("bf16", torch.bfloat16),
            ("f16", torch.float16),
            ("f32", torch.float32),
            ("f8", torch.float8_e4m3fn),
            ("i64", torch.int64),
            ("u8", torch.uint8),
            ("b", torch.bool),
        ]
    }
    tensors["strided"] = torch.arange(24).view(4, 6)[:, ::2]
    tensors["grad"] = torch.ones(4, requires_grad=True) * 2
    d = DataProto(batch=tensors, non_tensor_batch={"s": list("abcd")}, meta_info={"m": [1]})
    out = pickle.loads(pickle.dumps(d, protocol=protocol))
    assert out.batch["f8"].dtype == torch.float8_e4m3fn
    assert torch.equal(out.batch["f8"].float(), d.batch["f8"].float())
    del out.batch["f8"], d.batch["f8"]  # torch.equal has no float8 kernel
    assert_equal(out, d.to("cpu"))
    assert not out.batch["grad"].requires_grad


def test_pickle_of_a_slice_carries_only_its_rows():
    big = DataProto(batch={"x": torch.zeros(10_000, 100)})
    assert len(pickle.dumps(big[:10])) < 10_000 * 100 * 4 / 50


def test_unpickled_tensors_are_writable_and_independent():
    d = make(2)
    out = pickle.loads(pickle.dumps(d, protocol=5))
    out.batch["input_ids"][0, 0] = 42
    assert d.batch["input_ids"][0, 0] == 0


def test_save_and_load_round_trip(tmp_path):
    d = make(4, meta={"temperature": 0.6, "nested": {"t": (1, 2.5, None), "a": np.arange(3)}})
    d.non_tensor_batch["num"] = np.arange(4, dtype=np.float32)
    d.non_tensor_batch["text"] = np.array(["a", "bb", "c", "dd"])  # unicode dtype
    d.non_tensor_batch["scalars"] = np.array([None, np.int64(1), b"x", 2j], dtype=object)
    view = d[1:3]
    path = tmp_path / "d.pt"
    view.save_to_disk(path)
    loaded = DataProto.load_from_disk(path)
    assert_equal(loaded, view)
    assert loaded.meta_info["nested"]["t"] == (1, 2.5, None)
    assert loaded.non_tensor_batch["text"].dtype == np.dtype("<U2")
    assert type(loaded.non_tensor_batch["scalars"][0]) is np.int64
    # the file holds only the slice's rows, not the whole storage
    whole = tmp_path / "whole.pt"
    d.save_to_disk(whole)
    assert path.stat().st_size < whole.stat().st_size


class Opaque:
    pass


def test_save_refuses_arbitrary_objects(tmp_path):
    d = DataProto(non_tensor_batch={"o": [1, Opaque()]})
    with pytest.raises(DataProtoError, match=r"non_tensor_batch\['o'\]\[1\].*Opaque"):
        d.save_to_disk(tmp_path / "x.pt")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
def test_load_refuses_pickled_code_and_foreign_files(tmp_path):
    evil = tmp_path / "evil.pt"
    with evil.open("wb") as f:
        pickle.dump(make(2), f)  # a plain pickle that would run a constructor
    with pytest.raises(DataProtoError, match="cannot read"):
        DataProto.load_from_disk(evil)
    other = tmp_path / "other.pt"
    torch.save({"x": torch.zeros(1)}, other)
    with pytest.raises(DataProtoError, match="not a DataProto file"):
        DataProto.load_from_disk(other)
    with pytest.raises(DataProtoError, match="cannot read"):
        DataProto.load_from_disk(tmp_path / "missing.pt")


def _loads_read_only(d: DataProto) -> DataProto:
    """Unpickle the way Ray does: out-of-band buffers that are read-only views."""
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(d, protocol=5, buffer_callback=buffers.append)
    frozen = [memoryview(bytes(b.raw())).toreadonly() for b in buffers]
    return pickle.loads(blob, buffers=frozen)


def test_read_only_buffers_are_copied_on_first_batch_access_only():
    from rlcore.protocol.serialize import _SHARED, is_shared

    d = make(4)
    out = _loads_read_only(d)
    raw = out._batch["input_ids"]
    assert is_shared(raw)
    # read-only methods do not copy: concat/chunk/to/pickle keep working on the shared memory
    parts = out.chunk(2)
    assert is_shared(parts[0]._batch["logp"])
    assert not is_shared(DataProto.concat(parts)._batch["logp"])
    again = pickle.loads(pickle.dumps(out))
    assert torch.equal(again.batch["logp"], d.batch["logp"])
    # first access through .batch copies, so in-place writes are safe
    tensors = out.batch
    assert not any(is_shared(t) for t in tensors.values())
    tensors["input_ids"][0, 0] = 7
    assert raw[0, 0] == 0
    assert out.batch["logp"].dtype == torch.bfloat16
    assert parts[1].batch["input_ids"][0, 0] == 6  # views are copied when their own .batch is read
    assert out[0].batch["input_ids"][0] == 7
    del out, parts, raw, tensors, again
    import gc

    gc.collect()
    assert not _SHARED  # registrations go with the last tensor viewing the buffer
