"""Reward manager on a real (tiny, char-level) tokenizer: placement, decoding, routing,
weights, metrics, time limits and errors, in the driver and in the process pool."""

from __future__ import annotations

import logging
import string
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlcore.errors import ConfigError, DataError
from rlcore.protocol import DataProto
from rlcore.reward import RewardManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_reward_manager_doubles as doubles  # importable by pool workers

PAD, EOS = 0, 1
# Generous: a stall check, not a speed test. A stuck scorer would take an hour.
STALL_S = 60.0


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(string.printable)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    path = tmp_path_factory.mktemp("char_tokenizer")
    fast.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)  # the real loading path


def make_batch(
    tokenizer,
    rows,
    *,
    prompt_padding="left",
    with_response_mask=True,
    R=None,
):
    """rows: (prompt, response, ground_truth, data_source). An EOS ends each non-empty
    response; responses are right-padded to R, prompts padded on ``prompt_padding``."""
    p_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p, *_ in rows]
    r_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for _, r, *_ in rows]
    r_ids = [[*ids, EOS] if ids else [] for ids in r_ids]
    P = max(len(x) for x in p_ids)
    R = R or max(1, max(len(x) for x in r_ids))
    B = len(rows)
    prompts = torch.full((B, P), PAD)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    responses = torch.full((B, R), PAD)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        cols = slice(P - len(p), P) if prompt_padding == "left" else slice(0, len(p))
        prompts[i, cols] = torch.tensor(p)
        prompt_mask[i, cols] = 1
        responses[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        response_mask[i, : len(r)] = 1
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.cat([prompt_mask, response_mask], 1),
    }
    if with_response_mask:
        tensors["response_mask"] = response_mask
    non_tensors = {
        "data_source": [ds for *_, ds in rows],
        "reward_model": [{"style": "rule", "ground_truth": gt} for _, _, gt, _ in rows],
        "extra_info": [{"index": i, "split": "test"} for i in range(B)],
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), r_ids


def manager(tokenizer, **kw):
    kw.setdefault("rewards", {"scripted": doubles.ScriptedReward()})
    kw.setdefault("default", "scripted")
    return RewardManager(tokenizer, **kw)


ROWS = [
    ("What is 2+5?", "7", "7", "toy/a"),
    ("Q", "a longer wrong answer", "3", "toy/a"),
    ("A much longer prompt here", "12", "12", "toy/b"),
    ("x", "", "1", "toy/b"),  # nothing generated
]


# --- placement and decoding -----------------------------------------------------------------


@pytest.mark.parametrize("prompt_padding", ["left", "right"])
@pytest.mark.parametrize("with_response_mask", [True, False])
def test_score_lands_on_last_valid_token(tokenizer, prompt_padding, with_response_mask):
    data, r_ids = make_batch(
        tokenizer, ROWS, prompt_padding=prompt_padding, with_response_mask=with_response_mask
    )
    out, metrics = manager(tokenizer, num_workers=1)(data)
    tls = out.batch["token_level_scores"]
    assert tls.shape == data.batch["responses"].shape
    assert tls.dtype == torch.float32
    expected = [1.0, 0.0, 1.0, 0.0]
    for i, ids in enumerate(r_ids):
        if ids:  # the EOS is the last valid token, as in verl
            assert tls[i, len(ids) - 1] == expected[i]
            assert tls[i].sum() == expected[i]
            assert torch.count_nonzero(tls[i, len(ids) :]) == 0
        else:
            assert torch.count_nonzero(tls[i]) == 0
    # Decoded without special tokens or padding: the reward saw the exact text.
    assert list(out.non_tensor_batch["pred"]) == ["7", "a longer wrong answer", "12", None]
    assert list(out.non_tensor_batch["acc"]) == [True, False, True, False]
    assert list(out.non_tensor_batch["score"]) == expected
    assert list(out.non_tensor_batch["index"]) == [0, 1, 2, None]  # extra_info reached it
    assert metrics["reward/empty_responses"] == 1.0
    # The output unions into the batch, verl style.
    merged = data.union(out)
    assert "token_level_scores" in merged.batch


def test_response_mask_with_holes_places_on_last_masked_token(tokenizer):
    # Multi-turn: tool output inside the response is masked out of training (holes), the
    # score still goes on the last token the policy generated.
    data, _ = make_batch(tokenizer, [("q", "7", "7", "toy")], R=6)
    data.batch["responses"][0, :4] = torch.tensor(tokenizer("7xyz")["input_ids"])
    data.batch["responses"][0, 4] = EOS
    data.batch["response_mask"][0] = torch.tensor([1, 0, 0, 1, 0, 0])
    data.batch["attention_mask"][0, -6:] = torch.tensor([1, 1, 1, 1, 1, 0])
    out, _ = manager(tokenizer, num_workers=1)(data)
    assert out.batch["token_level_scores"][0].tolist() == [0, 0, 0, 0.0, 0, 0]
    assert out.non_tensor_batch["pred"][0] == "7xyz"  # decoded through the last attended token
    data.non_tensor_batch["reward_model"][0] = {"ground_truth": "7xyz"}
    out, _ = manager(tokenizer, num_workers=1)(data)
    assert out.batch["token_level_scores"][0].tolist() == [0, 0, 0, 1.0, 0, 0]


# --- routing, weights, metrics --------------------------------------------------------------


def test_sources_weights_and_metrics_per_data_source(tokenizer):
    rows = [
        ("q", "7", "7", "toy/a"),
        ("q", "8", "7", "toy/a"),
        ("q", "12", "12", "toy/b"),
        ("q", "5", "5", "other"),
    ]
    data, _ = make_batch(tokenizer, rows)
    rm = manager(
        tokenizer,
        rewards={
            "scripted": doubles.ScriptedReward(doubles.ScriptedReward.Config(value=2.0)),
            "length": doubles.LengthReward(doubles.LengthReward.Config()),
        },
        sources={"toy/a": ["scripted"], "toy/b": ["scripted", "length"]},
        default=["length"],
        weights={"length": 0.5},
        num_workers=1,
    )
    out, metrics = rm(data)
    # toy/a: scripted only; toy/b: 2.0 + 0.5 * len("12"); other: default 0.5 * len("5")
    assert list(out.non_tensor_batch["score"]) == [2.0, 0.0, 3.0, 0.5]
    assert list(out.non_tensor_batch["score/scripted"])[:3] == [2.0, 0.0, 2.0]
    assert np.isnan(out.non_tensor_batch["score/scripted"][3])
    assert list(out.non_tensor_batch["score/length"])[2:] == [2.0, 1.0]
    # acc: the reward's own where it gives one, else score > 0.
    assert list(out.non_tensor_batch["acc"]) == [True, False, True, True]
    assert metrics["reward/toy/a/score"] == 1.0
    assert metrics["reward/toy/a/acc"] == 0.5
    assert metrics["reward/toy/a/count"] == 2.0
    assert metrics["reward/toy/b/score"] == 3.0
    assert metrics["reward/other/acc"] == 1.0
    assert metrics["reward/errors"] == metrics["reward/timeouts"] == 0.0


def test_reasons_are_counted_per_batch(tokenizer):
    rows = [("q", "7", "7", "toy"), ("q", "8", "7", "toy"), ("q", "5", "5", "toy")]
    rows += [("q", "plain", "1", "toy"), ("q", "", "1", "toy")]  # no reason; nothing generated
    data, _ = make_batch(tokenizer, rows)
    rm = manager(tokenizer, rewards={"reason": doubles.ReasonReward()}, default="reason")
    out, metrics = rm(data)  # through the pool: extras travel back from the workers
    assert list(out.non_tensor_batch["reason"]) == ["pass", "fail", "pass", None, None]
    counted = {k: v for k, v in metrics.items() if k.startswith("reward/reason/")}
    assert counted == {"reward/reason/pass": 2.0, "reward/reason/fail": 1.0}
    rm.close()


def test_configuration_errors_name_what_to_fix(tokenizer):
    rewards = {"scripted": doubles.ScriptedReward()}
    with pytest.raises(ConfigError, match=r"reward 'gsm8kk' in \[reward.sources\] 'openai/gsm8k'"):
        RewardManager(tokenizer, rewards, sources={"openai/gsm8k": ["gsm8kk"]})
    with pytest.raises(ConfigError, match=r"'math' in \[reward\] default .* configured: scripted"):
        RewardManager(tokenizer, rewards, default="math")
    with pytest.raises(ConfigError, match=r"\[reward.weights\]"):
        RewardManager(tokenizer, rewards, default="scripted", weights={"nope": 1.0})
    rm = RewardManager(tokenizer, rewards, sources={"toy/a": "scripted"}, num_workers=1)
    data, _ = make_batch(tokenizer, [("q", "1", "1", "toy/z")])
    with pytest.raises(ConfigError, match=r"no reward for data_source 'toy/z'"):
        rm(data)


def test_data_errors_name_the_missing_field(tokenizer):
    data, _ = make_batch(tokenizer, [("q", "1", "1", "toy")])
    data.non_tensor_batch["reward_model"][0] = {"style": "rule"}
    with pytest.raises(DataError, match=r"row 0 has no reward_model.ground_truth"):
        manager(tokenizer, num_workers=1)(data)
    data, _ = make_batch(tokenizer, [("q", "1", "1", "toy")])
    data.non_tensor_batch.pop("data_source")
    with pytest.raises(DataError, match=r"no per-row 'data_source'"):
        manager(tokenizer, num_workers=1)(data)


# --- time limits and errors -----------------------------------------------------------------

TROUBLE = [
    ("q", "7", "7", "toy/a"),
    ("q", "SLEEP", "7", "toy/a"),
    ("q", "BOMB", "7", "toy/b"),
    ("q", "RAISE", "7", "toy/b"),
    ("q", "NAN", "7", "toy/b"),
    ("q", "TEXT", "7", "toy/b"),
    ("q", "12", "12", "toy/b"),
]


def test_timeouts_and_errors_in_the_driver(tokenizer, caplog):
    data, _ = make_batch(tokenizer, TROUBLE)
    rm = manager(tokenizer, num_workers=1, timeout_s=0.3)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rlcore.reward"):
        out, metrics = rm(data)
    assert time.monotonic() - start < STALL_S
    assert metrics["reward/timeouts"] == 2.0  # SLEEP, BOMB (a regex is interruptible)
    assert metrics["reward/errors"] == 3.0  # RAISE, NAN, TEXT
    assert list(out.non_tensor_batch["score"]) == [1.0, 0, 0, 0, 0, 0, 1.0]
    assert metrics["reward/toy/b/score"] == 0.2
    # One line per batch, with the first problem's message.
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "2 timeouts, 3 errors in 7 calls" in lines[0]


@pytest.mark.parametrize("num_workers", [1, 2], ids=["driver", "pool"])
def test_a_score_that_is_not_a_finite_number_is_an_error_scored_zero(
    tokenizer, caplog, num_workers
):
    """None, NaN, inf, a string or ``{"score": None}``: the row scores 0 and is counted in
    ``reward/errors`` with one warning per batch naming the first; the run goes on."""
    rows = [("q", w, "7", "toy/a") for w in ("NONE", "NAN", "INF", "TEXT", "NULLSCORE")]
    rows.append(("q", "7", "7", "toy/a"))
    data, _ = make_batch(tokenizer, rows)
    with (
        caplog.at_level(logging.WARNING, logger="rlcore.reward"),
        manager(tokenizer, num_workers=num_workers, pool_min_batch=1, pool_min_seconds=0.0) as rm,
    ):
        rm._seconds_per_task = 1.0  # with workers: everything goes to the pool
        out, metrics = rm(data)
    assert list(out.non_tensor_batch["score"]) == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert metrics["reward/errors"] == 5.0
    assert metrics["reward/timeouts"] == 0.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert (
        "0 timeouts, 5 errors in 6 calls; first: reward 'scripted': TypeError: reward score "
        "must be a number, got NoneType" in lines[0]
    )


def test_pool_enforces_limits_and_replaces_stuck_workers(tokenizer):
    rows = [*TROUBLE, ("q", "STUCK", "1", "toy/a"), ("q", "DIE", "1", "toy/a")]
    rows += [("q", str(k), str(k), "toy/c") for k in range(40)]
    data, _ = make_batch(tokenizer, rows)
    with manager(
        tokenizer, num_workers=2, timeout_s=0.5, pool_min_batch=1, pool_min_seconds=0.0
    ) as rm:
        rm._seconds_per_task = 1.0  # skip the probe: everything goes to the pool
        start = time.monotonic()
        out, metrics = rm(data)
        assert time.monotonic() - start < STALL_S
        pool = rm._pool
        assert pool is not None
        assert not pool.broken
        assert metrics["reward/timeouts"] == 3.0  # SLEEP, BOMB (alarm), STUCK (killed)
        assert metrics["reward/errors"] == 4.0  # RAISE, NAN, TEXT, DIE (worker died)
        assert pool.restarts == 2  # STUCK's and DIE's workers were replaced
        assert metrics["reward/toy/c/acc"] == 1.0  # the rest of their chunks were rescored
        assert list(out.non_tensor_batch["score"])[:7] == [1.0, 0, 0, 0, 0, 0, 1.0]
        # The pool keeps serving after the failures.
        _, metrics2 = rm(make_batch(tokenizer, rows[-40:])[0])
        assert metrics2["reward/toy/c/acc"] == 1.0
        assert metrics2["reward/errors"] == metrics2["reward/timeouts"] == 0.0


def test_off_main_thread_uses_a_worker_for_the_time_limit(tokenizer):
    data, _ = make_batch(tokenizer, [("q", "7", "7", "t"), ("q", "SLEEP", "7", "t")])
    result = {}
    with manager(tokenizer, num_workers=1 + 1, timeout_s=0.3) as rm:
        thread = threading.Thread(target=lambda: result.update(out=rm(data)))
        thread.start()
        thread.join(STALL_S)
        assert not thread.is_alive()
        out, metrics = result["out"]
        assert metrics["reward/timeouts"] == 1.0
        assert list(out.non_tensor_batch["score"]) == [1.0, 0.0]


def test_unpicklable_reward_falls_back_to_the_driver(tokenizer, caplog):
    data, _ = make_batch(tokenizer, [("q", "7", "7", "t"), ("q", "RAISE", "7", "t")])
    rm = manager(
        tokenizer,
        rewards={"scripted": doubles.UnpicklableReward()},
        num_workers=2,
        pool_min_batch=1,
        pool_min_seconds=0.0,
    )
    rm._seconds_per_task = 1.0
    with caplog.at_level(logging.WARNING, logger="rlcore.reward"):
        out, metrics = rm(data)
    assert "reward pool unavailable" in caplog.text
    assert list(out.non_tensor_batch["score"]) == [1.0, 0.0]
    assert metrics["reward/errors"] == 1.0


def test_small_cheap_batches_stay_in_the_driver(tokenizer):
    data, _ = make_batch(tokenizer, [("q", str(k), str(k), "t") for k in range(100)])
    rm = manager(tokenizer, num_workers=2, pool_min_batch=64, pool_min_seconds=0.2)
    out, _ = rm(data)
    assert rm._pool is None  # ~10 µs a call: a pool would not pay
    assert rm._seconds_per_task is not None
    assert all(out.non_tensor_batch["acc"])


def test_small_batch_stuck_in_c_is_killed_by_default(tokenizer):
    # Issue 15: a two-row batch used to be scored in the driver, where sum(range(10**13))
    # (one C call, the alarm cannot interrupt it) hung the run. By default every call goes
    # to a worker process, which is killed after timeout_s + grace.
    data, _ = make_batch(tokenizer, [("q", "7", "7", "t"), ("q", "CLOOP", "7", "t")])
    with manager(tokenizer, num_workers=2, timeout_s=2.0) as rm:
        start = time.monotonic()
        out, metrics = rm(data)
        assert time.monotonic() - start < STALL_S
        assert rm._pool is not None
        assert metrics["reward/timeouts"] == 1.0
        assert list(out.non_tensor_batch["score"]) == [1.0, 0.0]


class _ImportingReward(doubles.ScriptedReward):
    """Imports a module whose import takes 0.4 s of Python work, then spins."""

    def score(self, data_source, solution_str, ground_truth, extra_info=None):
        import rlcore_slow_reward_import  # noqa: F401

        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            pass
        return 1.0


def test_alarm_never_fires_inside_an_import(tmp_path, monkeypatch):
    # A deadline landing in an import would leave the module half-initialised in
    # sys.modules for the rest of the process; the tick is deferred until it is done.
    from rlcore.reward._scoring import alarm_handler, call_reward

    (tmp_path / "rlcore_slow_reward_import.py").write_text(
        "import time\n_end = time.monotonic() + 0.4\n"
        "while time.monotonic() < _end:\n    pass\nDONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rlcore_slow_reward_import", raising=False)
    task = (0, "imp", "toy", "x", "1", None)
    with alarm_handler():
        status, *_ = call_reward({"imp": _ImportingReward()}, task, 0.02)
    assert status == "timeout"
    assert sys.modules["rlcore_slow_reward_import"].DONE is True


def test_numeric_extras_reach_the_metrics_per_source(tokenizer):
    rows = [("q", "7", "7", "toy"), ("q", "88", "7", "toy"), ("q", "nan", "1", "toy")]
    rows += [("q", "5", "5", "other")]
    data, _ = make_batch(tokenizer, rows)
    rm = manager(tokenizer, rewards={"x": doubles.ExtrasReward()}, default="x")
    out, metrics = rm(data)
    assert list(out.non_tensor_batch["pred"]) == ["7", "88", "nan", "5"]
    assert metrics["reward/toy/used_tool"] == pytest.approx(1 / 3)
    assert metrics["reward/toy/length"] == pytest.approx(1.5)  # the NaN row gives none
    assert metrics["reward/other/used_tool"] == 1.0
    assert metrics["reward/other/length"] == 1.0
    assert not any(k.endswith("/pred") for k in metrics)  # strings are not averaged
    rm.close()
