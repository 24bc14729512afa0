"""PromptDataset: parquet/jsonl in verl's schema, chat template, filtering, clear errors."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlcore.data import PromptDataset, load_tokenizer, read_rows
from rlcore.errors import DataError


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from rlcore.testing.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), layers=1)
    return load_tokenizer(path)


def rows(n: int = 5, *, long_every: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        q = f"What is {i} + {i}?"
        if long_every and i % long_every == 0:
            q = q + " please" * 20
        out.append(
            {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": q}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                "extra_info": {"split": "train", "index": 100 + i},
            }
        )
    return out


def write_parquet(path, data):
    pq.write_table(pa.Table.from_pylist(data), path)
    return path


def write_jsonl(path, data):
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def test_parquet_and_jsonl_give_the_same_prompts(tmp_path, tokenizer):
    data = rows(5)
    a = PromptDataset(write_parquet(tmp_path / "t.parquet", data), tokenizer, max_prompt_length=64)
    b = PromptDataset(
        [str(write_jsonl(tmp_path / "t.jsonl", data))], tokenizer, max_prompt_length=64
    )
    assert len(a) == len(b) == 5
    assert a.input_ids == b.input_ids
    item = a[3]
    assert item["data_source"] == "arithmetic"
    assert item["reward_model"]["ground_truth"] == "6"
    assert item["index"] == 103
    assert item["raw_prompt"] == [{"role": "user", "content": "What is 3 + 3?"}]
    # the chat template was applied once, with the generation prompt, and no extra specials
    text = tokenizer.decode(item["input_ids"])
    assert text == "<|im_start|>user\nWhat is 3 + 3?<|im_end|>\n<|im_start|>assistant\n"


def test_several_files_concatenate_and_string_prompts_become_user_messages(tmp_path, tokenizer):
    plain = [dict(r, prompt=r["prompt"][0]["content"]) for r in rows(3)]
    ds = PromptDataset(
        [write_parquet(tmp_path / "a.parquet", rows(2)), write_jsonl(tmp_path / "b.jsonl", plain)],
        tokenizer,
        max_prompt_length=64,
    )
    assert len(ds) == 5
    assert tokenizer.decode(ds[4]["input_ids"]).startswith("<|im_start|>user\nWhat is 2 + 2?")


def test_without_chat_template_plain_strings_are_tokenized_as_is(tmp_path, tokenizer):
    plain = [dict(r, prompt=f"Q: {i}") for i, r in enumerate(rows(2))]
    ds = PromptDataset(
        write_jsonl(tmp_path / "p.jsonl", plain),
        tokenizer,
        max_prompt_length=64,
        apply_chat_template=False,
    )
    assert tokenizer.decode(ds[1]["input_ids"]) == "Q: 1"
    with pytest.raises(DataError, match="apply_chat_template is false"):
        PromptDataset(
            write_jsonl(tmp_path / "m.jsonl", rows(1)),
            tokenizer,
            max_prompt_length=64,
            apply_chat_template=False,
        )


def test_overlong_prompts_are_filtered_with_a_logged_count(tmp_path, tokenizer, caplog):
    path = write_parquet(tmp_path / "train.parquet", rows(9, long_every=3))  # rows 0, 3, 6 long
    with caplog.at_level(logging.WARNING, logger="rlcore.data"):
        ds = PromptDataset(path, tokenizer, max_prompt_length=64)
    assert len(ds) == 6
    assert all(len(ids) <= 64 for ids in ds.input_ids)
    assert [ds[i]["index"] for i in range(len(ds))] == [101, 102, 104, 105, 107, 108]
    assert "filtered 3 of 9 prompts longer than 64 tokens from train.parquet" in caplog.text


def test_overlong_prompts_without_filtering_raise_or_truncate(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", rows(4, long_every=2))
    with pytest.raises(DataError, match=r"t\.jsonl row 0: prompt has \d+ tokens.*2 such rows"):
        PromptDataset(path, tokenizer, max_prompt_length=64, filter_overlong_prompts=False)
    left = PromptDataset(
        path, tokenizer, max_prompt_length=64, filter_overlong_prompts=False, truncation="left"
    )
    assert len(left) == 4
    assert len(left[0]["input_ids"]) == 64
    assert tokenizer.decode(left[0]["input_ids"]).endswith("<|im_start|>assistant\n")


def test_all_prompts_filtered_is_an_error(tmp_path, tokenizer):
    path = write_parquet(tmp_path / "t.parquet", rows(3))
    with pytest.raises(DataError, match=r"all 3 prompts in .*t\.parquet are longer than"):
        PromptDataset(path, tokenizer, max_prompt_length=5)


def test_max_samples_keeps_the_first_rows(tmp_path, tokenizer):
    ds = PromptDataset(
        write_jsonl(tmp_path / "t.jsonl", rows(6)), tokenizer, max_prompt_length=64, max_samples=2
    )
    assert len(ds) == 2
    assert len(ds.reward_models) == len(ds.indices) == 2


@pytest.mark.parametrize(
    ("drop", "column"),
    [
        ("prompt", "prompt"),
        ("data_source", "data_source"),
        ("reward_model", "reward_model"),
        ("ground_truth", "reward_model.ground_truth"),
    ],
)
def test_missing_columns_name_the_file_and_the_column(tmp_path, tokenizer, drop, column):
    data = rows(2)
    for r in data:
        if drop == "ground_truth":
            del r["reward_model"]["ground_truth"]
        else:
            del r[drop]
    for path in (
        write_jsonl(tmp_path / "bad.jsonl", data),
        write_parquet(tmp_path / "bad.parquet", data),
    ):
        with pytest.raises(DataError, match=rf"bad\.\w+ row 0: missing required column '{column}'"):
            PromptDataset(path, tokenizer, max_prompt_length=64)


def test_empty_missing_and_unsupported_files(tmp_path, tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=r"empty\.jsonl has no rows"):
        PromptDataset(empty, tokenizer, max_prompt_length=64)
    with pytest.raises(DataError, match=r"nope\.parquet does not exist"):
        PromptDataset(tmp_path / "nope.parquet", tokenizer, max_prompt_length=64)
    csv = tmp_path / "t.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported extension '\.csv'"):
        read_rows(csv)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": 1}\n{oops\n')
    with pytest.raises(DataError, match=r"broken\.jsonl:2: not a JSON object"):
        read_rows(broken)


def test_load_tokenizer_errors_name_the_path(tmp_path, tokenizer):
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no tokenizer could be loaded from .*empty"):
        load_tokenizer(tmp_path / "empty")
    tokenizer.save_pretrained(tmp_path / "plain")
    (tmp_path / "plain" / "chat_template.jinja").unlink()
    cfg = json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (tmp_path / "plain" / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match=r"plain has no chat template"):
        load_tokenizer(tmp_path / "plain")
    assert load_tokenizer(tmp_path / "plain", require_chat_template=False).pad_token_id is not None
