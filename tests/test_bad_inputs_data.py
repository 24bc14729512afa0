"""Bad-input catalogue, phase 2a: data files and rows, checked by ``rlcore train`` before Ray.

Each case: one exact line on stderr, exit code 2, no traceback (see ``_bad_inputs.py``).
"""

from __future__ import annotations

import json

import _bad_inputs as bi
import pytest

from rlcore.config import load_config
from rlcore.preflight import preflight

registry, tiny, run = bi.registry, bi.tiny, bi.run


def test_missing_train_file(run, capsys, registry):
    missing = bi.data_dir(run) / "nope.jsonl"
    bi.case(
        run,
        capsys,
        registry,
        [f'data.train_files="{missing}"'],
        f"data.train_files: data file {missing} does not exist",
    )


def test_missing_val_file(run, capsys, registry):
    missing = bi.data_dir(run) / "val2.parquet"
    bi.case(
        run,
        capsys,
        registry,
        [f'data.val_files=["{missing}"]'],
        f"data.val_files: data file {missing} does not exist",
    )


def test_data_path_is_a_directory(run, capsys, registry):
    folder = bi.data_dir(run)
    bi.case(
        run,
        capsys,
        registry,
        [f'data.train_files="{folder}"'],
        f"data.train_files: {folder} is not a file",
    )


def test_unsupported_extension(run, capsys, registry):
    csv = bi.data_dir(run) / "train.csv"
    csv.write_text("prompt,answer\n1+1,2\n")
    bi.case(
        run,
        capsys,
        registry,
        [f'data.train_files="{csv}"'],
        f"data.train_files: data file {csv}: unsupported extension '.csv' (use .parquet or .jsonl)",
    )


def test_corrupt_parquet(run, capsys, registry):
    bad = bi.data_dir(run) / "train.parquet"
    bad.write_bytes(b"this is not parquet at all")
    code, err = bi.train_preflight(run, [f'data.train_files="{bad}"'], capsys, registry)
    # pyarrow's own reason follows; the start names the key and the file.
    assert err.startswith(f"error: data.train_files: cannot read parquet file {bad}: ")
    bi.assert_one_line(code, err, err.removeprefix("error: ").removesuffix("\n"))


def test_invalid_json_line(run, capsys, registry):
    bad = bi.data_dir(run) / "train.jsonl"
    bad.write_text(json.dumps(bi.row(0)) + "\n{not json\n")
    bi.case(
        run,
        capsys,
        registry,
        [],
        f"data.train_files: {bad}:2: not a JSON object per line: Expecting property name "
        "enclosed in double quotes",
    )


def test_not_utf8(run, capsys, registry):
    bad = bi.data_dir(run) / "train.jsonl"
    bad.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    bi.case(
        run,
        capsys,
        registry,
        [],
        f"data.train_files: {bad} is not UTF-8 text (invalid start byte at byte 12)",
    )


def test_empty_data_file(run, capsys, registry):
    empty = bi.data_dir(run) / "train.jsonl"
    empty.write_text("")
    bi.case(run, capsys, registry, [], f"data.train_files: data file {empty} has no rows")


def test_missing_data_source_column(run, capsys, registry):
    file = bi.data_dir(run) / "train.jsonl"
    rows = [bi.row(i) for i in range(8)]
    del rows[3]["data_source"]
    bi.write_jsonl(file, rows)
    bi.case(
        run,
        capsys,
        registry,
        [],
        f"data.train_files: {file} row 3: missing required column 'data_source'",
    )


def test_missing_ground_truth(run, capsys, registry):
    file = bi.data_dir(run) / "val.jsonl"
    bi.write_jsonl(file, [bi.row(0, reward_model={"style": "rule"})])
    bi.case(
        run,
        capsys,
        registry,
        [],
        f"data.val_files: {file} row 0: missing required column 'reward_model.ground_truth'",
    )


def test_wrong_prompt_key(run, capsys, registry):
    file = bi.data_dir(run) / "train.jsonl"
    bi.case(
        run,
        capsys,
        registry,
        ['data.prompt_key="question"'],
        f"data.train_files: {file} row 0: missing required column 'question'",
    )


@pytest.mark.skipif(not bi.GSM8K_RAW.is_file(), reason="real data not found at ../shared/data")
def test_raw_gsm8k_file_without_preparation(run, capsys, registry):
    """The untouched GSM8K file (question/answer) instead of the prepared verl schema."""
    file = bi.GSM8K_RAW.resolve()
    bi.case(
        run,
        capsys,
        registry,
        [f'data.train_files="{file}"'],
        f"data.train_files: {file} row 0: missing required column 'prompt'",
    )


def test_all_prompts_longer_than_the_limit(run, capsys, registry):
    file = bi.data_dir(run) / "train.jsonl"
    bi.case(
        run,
        capsys,
        registry,
        ["data.max_prompt_length=8"],
        f"data.train_files: all 8 prompts in {file} are longer than max_prompt_length=8 tokens; "
        "raise max_prompt_length",
    )


def test_overlong_prompts_without_filtering(run, capsys, registry):
    file = bi.data_dir(run) / "train.jsonl"
    bi.case(
        run,
        capsys,
        registry,
        ["data.max_prompt_length=8", "data.filter_overlong_prompts=false"],
        f"data.train_files: {file} row 0: prompt has 33 tokens, more than max_prompt_length=8 "
        "(8 such rows); set filter_overlong_prompts = true, raise max_prompt_length, or choose "
        "a truncation",
    )


def test_overlong_prompts_are_filtered_with_a_logged_count(run, caplog, registry):
    file = bi.data_dir(run) / "train.jsonl"
    rows = [bi.row(i) for i in range(8)]
    rows[5]["prompt"] = [{"role": "user", "content": "x" * 100}]
    bi.write_jsonl(file, rows)
    with caplog.at_level("WARNING", logger="rlcore.data.dataset"):
        preflight(load_config(run, registry=registry), registry=registry)
    assert "filtered 1 of 8 prompts longer than 64 tokens from train.jsonl" in caplog.text


def test_all_validation_prompts_longer_than_the_limit(run, capsys, registry):
    """The validation files follow the same rule as the training files (issue 31: prompts over
    ``max_prompt_length``): one line naming data.val_files."""
    file = bi.data_dir(run) / "val.jsonl"
    rows = [bi.row(i, prompt=[{"role": "user", "content": "x" * 100}]) for i in range(2)]
    bi.write_jsonl(file, rows)
    bi.case(
        run,
        capsys,
        registry,
        [],
        f"data.val_files: all 2 prompts in {file} are longer than max_prompt_length=64 tokens; "
        "raise max_prompt_length",
    )


@pytest.mark.parametrize("side", ["left", "right"])
def test_overlong_prompts_truncated_with_a_logged_count(run, caplog, registry, side):
    """``filter_overlong_prompts = false`` with a truncation: each over-long prompt is cut to
    ``max_prompt_length`` tokens on that side, and how many were cut is logged."""
    file = bi.data_dir(run) / "train.jsonl"
    rows = [bi.row(i) for i in range(8)]
    rows[5]["prompt"] = [{"role": "user", "content": "x" * 100}]
    bi.write_jsonl(file, rows)
    overrides = ["data.filter_overlong_prompts=false", f'data.truncation="{side}"']
    with caplog.at_level("WARNING", logger="rlcore.data.dataset"):
        checked = preflight(load_config(run, overrides, registry=registry), registry=registry)
    assert (
        f"truncated 1 of 8 prompts longer than 64 tokens from train.jsonl (data.truncation = "
        f"{side})" in caplog.text
    )
    assert len(checked.train_set) == 8
    kept = checked.train_set[5]["input_ids"]
    full = checked.tokenizer.apply_chat_template(
        rows[5]["prompt"], add_generation_prompt=True, tokenize=False
    )
    ids = checked.tokenizer(full, add_special_tokens=False)["input_ids"]
    assert kept == (ids[-64:] if side == "left" else ids[:64])


def test_fewer_prompts_than_one_batch(run, capsys, registry):
    bi.write_jsonl(bi.data_dir(run) / "train.jsonl", [bi.row(0), bi.row(1), bi.row(2)])
    bi.case(
        run,
        capsys,
        registry,
        [],
        "data.train_batch_size: the train set has 3 prompts (after filtering), fewer than one "
        "batch of 4; lower it or add data",
    )


def test_chat_messages_without_chat_template(run, capsys, registry):
    file = bi.data_dir(run) / "train.jsonl"
    bi.case(
        run,
        capsys,
        registry,
        ["data.apply_chat_template=false"],
        f"data.train_files: {file} row 0: column 'prompt' holds chat messages but "
        "apply_chat_template is false; give plain strings or enable the template",
    )


def test_every_prompt_empty_without_chat_template(run, capsys, registry):
    file = bi.data_dir(run) / "train.jsonl"
    bi.write_jsonl(file, [bi.row(i, prompt="") for i in range(8)])
    bi.case(
        run,
        capsys,
        registry,
        ["data.apply_chat_template=false"],
        f"data.train_files: {file} row 0: column 'prompt' is an empty prompt; remove the row "
        "or write the prompt",
    )


CHAT_CASES = [
    ([], "is an empty list of messages; give at least one message"),
    ([{"role": "user", "content": 5}], "message 0: content must be a string, got 5"),
    ([{"role": "user", "content": None}], "message 0: content must be a string, got null"),
    ([{"role": 7, "content": "hi"}], "message 0: role must be a string, got 7"),
]


@pytest.mark.parametrize(("prompt", "message"), CHAT_CASES, ids=["[]", "5", "null", "role7"])
def test_bad_chat_messages(run, capsys, registry, prompt, message):
    file = bi.data_dir(run) / "train.jsonl"
    rows = [bi.row(i) for i in range(8)]
    rows[2]["prompt"] = prompt
    bi.write_jsonl(file, rows)
    bi.case(run, capsys, registry, [], f"data.train_files: {file} row 2: column 'prompt' {message}")


@pytest.mark.parametrize(
    ("override", "key", "value"),
    [("data.seed=-1", "data.seed", -1), (f"trainer.seed={2**64}", "trainer.seed", 2**64)],
    ids=["data.seed=-1", "trainer.seed=2**64"],
)
def test_seed_out_of_range(run, capsys, registry, override, key, value):
    bi.case(
        run,
        capsys,
        registry,
        [override],
        f"{key}: must be between 0 and 2**32 - 1 (4294967295), got {value}",
    )
