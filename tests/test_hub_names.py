"""Hub names for the model and the data, resolved offline from a Hugging Face cache built here
(the Hub's layout: ``models--org--name/snapshots/<commit>/...``, ``refs/<branch>``;
``HF_HOME`` a temporary folder, ``HF_HUB_OFFLINE=1``). Local paths are unchanged; a name that
is neither a local path nor cached is one line naming the cache and ``HF_HUB_OFFLINE``, before
Ray starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.preflight.hub import resolve_dataset, resolve_hub_names, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"


def _cache(hub: Path, kind: str, repo: str, files: dict[str, Path], commit: str, ref: str) -> Path:
    """Put ``files`` (name -> source) in the cache as ``repo`` at ``commit``, ``ref`` naming it."""
    root = hub / f"{kind}s--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    for name, source in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, snapshot / name)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlcore.testing.runs import tiny_run_model

    return tiny_run_model(tmp_path_factory.mktemp("hub") / "model")


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny):
    """An offline cache holding model org/tiny (main and tag v1) and data set org/arith."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hf" / "hub"
    files = {p.name: p for p in tiny.iterdir() if p.is_file()}
    main_snapshot = _cache(cache, "model", "org/tiny", files, COMMIT, "main")
    tag_snapshot = _cache(cache, "model", "org/tiny", files, OTHER, "v1")
    parquet = {}
    for split, pairs in {"train": [(1, 2), (3, 4), (2, 5), (6, 1)], "test": [(4, 4)]}.items():
        table = pa.table({
            "question": [f"What is {a} + {b}?" for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
        })  # fmt: skip
        path = tmp_path / f"{split}.parquet"
        pq.write_table(table, path)
        parquet[f"data/{split}-00000-of-00001.parquet"] = path
    data_snapshot = _cache(cache, "dataset", "org/arith", parquet, COMMIT, "main")
    return {"cache": cache, "main": main_snapshot, "v1": tag_snapshot, "data": data_snapshot}


def test_model_names_and_revisions_resolve_to_cache_snapshots(hub, tiny):
    assert resolve_model("org/tiny", None, "model.path") == str(hub["main"])
    assert resolve_model("org/tiny", "v1", "model.path") == str(hub["v1"])
    assert resolve_model(str(tiny), None, "model.path") == str(tiny)  # local: unchanged
    assert resolve_model("no/such/folder", None, "model.path") == "no/such/folder"


def test_data_set_names_resolve_to_the_split_files(hub):
    data = hub["data"] / "data"
    assert resolve_dataset("org/arith", "k", "train") == [
        str(data / "train-00000-of-00001.parquet")
    ]
    assert resolve_dataset("org/arith:test", "k", "train") == [
        str(data / "test-00000-of-00001.parquet")
    ]
    assert resolve_dataset(f"org/arith@{COMMIT}:train", "k", "test")[0].endswith(
        "train-00000-of-00001.parquet"
    )
    assert resolve_dataset("local/file.jsonl", "k", "train") == ["local/file.jsonl"]
    with pytest.raises(Exception, match="no parquet files for split 'validation'"):
        resolve_dataset("org/arith:validation", "data.val_files", "test")


def _toml(tmp_path, model: str, train: str, val: str) -> Path:
    from rlcore.testing.runs import tiny_run_toml

    text = tiny_run_toml(
        model=model,
        train_files=[train],
        val_files=[val],
        test_freq=2,
        run_dir=tmp_path / "run",
        extra="",
    )
    columns = (
        '\n[data.columns]\nprompt = "question"\nground_truth = "answer"\ndata_source = "arith"\n'
    )
    text = text.replace("\n[model]", columns + "\n[model]", 1)
    path = tmp_path / "hub.toml"
    path.write_text(text)
    return path


def test_paths_under_home_expand_the_tilde(monkeypatch, tmp_path):
    """``~/...`` in a model path or a data file is the user's home, as a shell would read it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_dataset("~/data/train.parquet", "data.train_files", "train") == [
        str(tmp_path / "data" / "train.parquet")
    ]
    assert resolve_model("~/models/tiny", None, "model.path") == str(tmp_path / "models" / "tiny")


def test_a_missing_name_is_one_line_naming_the_cache_and_offline_mode(hub, tmp_path, capsys):
    config = _toml(tmp_path, "org/missing", "org/arith", "org/arith")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "model.path: 'org/missing' is neither a local path nor a model" in err
    assert str(hub["cache"]) in err
    assert "HF_HUB_OFFLINE=1" in err
    assert not (tmp_path / "run").exists()  # stopped before the run (and Ray) started

    config = _toml(tmp_path, "org/tiny", "org/nodata", "org/arith")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "data.train_files: 'org/nodata' is neither a local path nor a data set" in err


@pytest.mark.slow
def test_the_tiny_run_trains_from_hub_names(ray_session, hub, tmp_path):
    from rlcore.config import load_config_text
    from rlcore.trainer import run_training

    text = _toml(tmp_path, "org/tiny", "org/arith:train", "org/arith").read_text()
    config = load_config_text(text, source="hub.toml")
    assert config.model.path == "org/tiny"  # the config keeps the name; the run resolves it
    resolved = resolve_hub_names(config)
    assert resolved.model.path == resolved.model.tokenizer_path == str(hub["main"])
    assert run_training(config) == 0
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "val/arith/acc" in rows[0]  # the mapped data_source, from the data set's test split
    assert "reward/arith/score" in rows[1]
