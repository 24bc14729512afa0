"""Batched reward scorers beside the per-sample ones, in the reward manager: the real GSM8K
rule reward and batched scorers written here, combined by weight; per-scorer metrics; token-
level scores placed on their tokens; a scorer that breaks the contract is one error naming it.
The end-to-end run is ``test_reward_batched_run.py``."""

from __future__ import annotations

import string
import time

import attrs
import numpy as np
import pytest
import torch

from rlcore.errors import PluginError, RewardError
from rlcore.hookspecs import hookimpl
from rlcore.interfaces import (
    CONTRACT_VERSION,
    BaseBatchReward,
    BatchScores,
    RewardBatch,
)
from rlcore.plugins import PluginRegistry
from rlcore.protocol import DataProto
from rlcore.reward import RewardManager
from rlcore_gsm8k.reward import GSM8KReward

PAD, EOS = 0, 1


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """One token per printable character; saved and loaded as a real tokenizer folder."""
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
    return AutoTokenizer.from_pretrained(path)


def make_batch(tokenizer, rows, R=None):
    """rows: (prompt, response, ground_truth, data_source); an EOS ends each non-empty
    response, responses right-padded to R, prompts left-padded."""
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
        prompts[i, P - len(p) :] = torch.tensor(p)
        prompt_mask[i, P - len(p) :] = 1
        responses[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        response_mask[i, : len(r)] = 1
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.cat([prompt_mask, response_mask], 1),
            "response_mask": response_mask,
        },
        non_tensors={
            "data_source": [ds for *_, ds in rows],
            "reward_model": [{"style": "rule", "ground_truth": gt} for _, _, gt, _ in rows],
            "extra_info": [{"index": i, "split": "test"} for i in range(B)],
        },
    )
    return data, [len(r) for r in r_ids]


# --- batched scorers written here ------------------------------------------------------------


class Judge(BaseBatchReward):
    """Sequence-level: 1.0 when the response contains the ground truth, else 0.25; it records
    every batch it was given and says so in an extra and a metric."""

    @attrs.frozen(kw_only=True)
    class Config(BaseBatchReward.Config):
        hit: float = 1.0

    def __init__(self, config=None):
        super().__init__(config)
        self.seen: list[RewardBatch] = []
        self.closed = False

    def score_batch(self, batch):
        self.seen.append(batch)
        hits = [str(g) in r for r, g in zip(batch.responses, batch.ground_truths)]
        scores = torch.tensor([self.config.hit if h else 0.25 for h in hits])
        return BatchScores(
            scores=scores,
            extras={"verdict": ["yes" if h else "no" for h in hits], "acc": hits},
            metrics={"rows": float(len(batch))},
        )

    def close(self):
        self.closed = True


class PerToken(BaseBatchReward):
    """Token-level: 0.1 on every response token, and junk (NaN) outside the mask, which the
    manager must drop."""

    def score_batch(self, batch):
        mask = batch.response_mask
        return BatchScores(scores=torch.where(mask != 0, 0.1, float("nan")))


class WrongShape(BaseBatchReward):
    def score_batch(self, batch):
        return BatchScores(scores=torch.zeros(len(batch) + 1))


class NonFinite(BaseBatchReward):
    def score_batch(self, batch):
        return BatchScores(scores=torch.full((len(batch),), float("inf")))


class IntScores(BaseBatchReward):
    def score_batch(self, batch):
        return BatchScores(scores=torch.ones(len(batch), dtype=torch.long))


class Raises(BaseBatchReward):
    def score_batch(self, batch):
        msg = "the judge's server said 503"
        raise ConnectionError(msg)


class Slow(BaseBatchReward):
    def score_batch(self, batch):
        time.sleep(30)
        return BatchScores(scores=torch.zeros(len(batch)))


ROWS = [
    ("What is 3+4?", "3 + 4 = 7\n#### 7", "7", "openai/gsm8k"),  # gsm8k 1, judge 1
    ("What is 2+2?", "#### 5", "4", "openai/gsm8k"),  # gsm8k 0 (wrong), judge 0.25
    ("What is 1+1?", "two", "2", "openai/gsm8k"),  # gsm8k 0 (no answer), judge 0.25
    ("What is 5+5?", "", "10", "openai/gsm8k"),  # nothing generated: 0, no scorer sees it
]


def test_per_sample_and_batched_scores_combine_by_weight(tokenizer):
    data, lens = make_batch(tokenizer, ROWS, R=24)
    judge = Judge()
    rm = RewardManager(
        tokenizer,
        {"gsm8k": GSM8KReward(), "judge": judge},
        default=["gsm8k", "judge"],
        weights={"gsm8k": 1.0, "judge": 0.5},
        num_workers=1,
    )
    out, metrics = rm(data)
    expected = [1.0 + 0.5 * 1.0, 0.5 * 0.25, 0.5 * 0.25, 0.0]
    assert list(out.non_tensor_batch["score"]) == pytest.approx(expected)
    # Each scorer's own (unweighted) score per row; NaN where it did not score.
    assert list(out.non_tensor_batch["score/gsm8k"])[:3] == [1.0, 0.0, 0.0]
    assert list(out.non_tensor_batch["score/judge"])[:3] == [1.0, 0.25, 0.25]
    assert np.isnan(out.non_tensor_batch["score/judge"][3])
    # The combined score sits on the last valid response token; nothing elsewhere.
    tls = out.batch["token_level_scores"]
    assert tls.shape == (4, 24)
    assert tls.dtype == torch.float32
    for i, n in enumerate(lens):
        if n:
            assert tls[i, n - 1].item() == pytest.approx(expected[i])
        assert tls[i].sum().item() == pytest.approx(expected[i])
    # Per-row extras of both kinds reach the batch: gsm8k is listed first, so its acc wins.
    assert list(out.non_tensor_batch["verdict"]) == ["yes", "no", "no", None]
    assert list(out.non_tensor_batch["pred"]) == ["7", "5", None, None]
    assert list(out.non_tensor_batch["acc"]) == [True, False, False, False]
    # Per-scorer metrics, each over the rows it scored, and the scorer's own metric.
    assert metrics["reward/scorer/gsm8k/mean"] == pytest.approx(1 / 3)
    assert metrics["reward/scorer/judge/mean"] == pytest.approx(0.5)
    assert metrics["reward/scorer/judge/rows"] == 3.0
    assert metrics["reward/openai/gsm8k/score"] == pytest.approx(sum(expected) / 4)
    assert metrics["reward/empty_responses"] == 1.0
    rm.close()
    assert judge.closed


def test_the_batched_scorer_gets_its_rows_laid_out(tokenizer):
    rows = [*ROWS, ("Say hi", "hi", "hi", "chat")]
    data, lens = make_batch(tokenizer, rows, R=24)
    judge = Judge(Judge.Config(hit=2.0))
    rm = RewardManager(
        tokenizer,
        {"gsm8k": GSM8KReward(), "judge": judge},
        sources={"openai/gsm8k": ["gsm8k"], "chat": ["judge", "gsm8k"]},
        num_workers=1,
    )
    out, metrics = rm(data)
    (batch,) = judge.seen  # one call, on the one row that selects it
    assert len(batch) == 1
    assert batch.prompts == ("Say hi",)
    assert batch.responses == ("hi",)  # the EOS is a special token: skipped
    assert batch.data_sources == ("chat",)
    assert batch.ground_truths == ("hi",)
    assert batch.extra_infos == ({"index": 4, "split": "test"},)
    assert batch.response_ids.shape == (1, 24)
    assert batch.response_mask.dtype == torch.float32
    assert batch.response_mask.sum().item() == lens[4]
    assert batch.prompt_ids.shape == (1, data.batch["prompts"].shape[1])
    assert batch.attention_mask.shape == (1, data.batch["attention_mask"].shape[1])
    assert list(batch.data.non_tensor_batch["reward_model"]) == [
        {"style": "rule", "ground_truth": "hi"}
    ]
    # Listed first for "chat", the judge's acc wins there; its extras are None elsewhere.
    assert list(out.non_tensor_batch["acc"])[4] is True
    assert list(out.non_tensor_batch["verdict"]) == [None] * 4 + ["yes"]
    assert out.non_tensor_batch["score"][4] == pytest.approx(2.0)  # gsm8k: no #### -> 0
    assert metrics["reward/scorer/judge/mean"] == 2.0


def test_token_level_scores_land_on_their_tokens(tokenizer):
    data, lens = make_batch(tokenizer, ROWS, R=24)
    rm = RewardManager(
        tokenizer,
        {"gsm8k": GSM8KReward(), "per_token": PerToken()},
        default=["gsm8k", "per_token"],
        weights={"per_token": 2.0},
        num_workers=1,
    )
    out, metrics = rm(data)
    tls = out.batch["token_level_scores"]
    mask = data.batch["response_mask"].bool()
    gsm8k = [1.0, 0.0, 0.0, 0.0]
    for i, n in enumerate(lens):
        want = torch.zeros(24)
        want[:n] = 2.0 * 0.1
        if n:
            want[n - 1] += gsm8k[i]
        assert torch.allclose(tls[i], want), (i, tls[i])
    assert torch.all(tls[~mask] == 0)  # the scorer's NaN outside the mask is dropped
    # A token-level scorer's row score is its sum over the valid tokens.
    assert out.non_tensor_batch["score/per_token"][0] == pytest.approx(0.1 * lens[0])
    assert out.non_tensor_batch["score"][0] == pytest.approx(1.0 + 0.2 * lens[0])
    assert metrics["reward/scorer/per_token/mean"] == pytest.approx(0.1 * sum(lens) / 3)


@pytest.mark.parametrize(
    ("scorer", "message"),
    [
        (
            WrongShape(),
            r"^reward 'bad': score_batch returned scores of shape \(4,\) for 3 rows; expected "
            r"\(3,\) \(one score per row\) or \(3, 24\) \(token-level, aligned with responses\)$",
        ),
        (
            NonFinite(),
            r"^reward 'bad': score_batch returned a non-finite score for row 0 "
            r"\(data_source 'openai/gsm8k'\): inf$",
        ),
        (
            IntScores(),
            r"^reward 'bad': score_batch returned scores of dtype torch.int64; expected a "
            r"floating-point dtype$",
        ),
        (
            Raises(),
            r"^reward 'bad' \(Raises.score_batch\) raised ConnectionError: the judge's server "
            r"said 503$",
        ),
    ],
)
def test_a_scorer_breaking_the_contract_is_one_error_naming_it(tokenizer, scorer, message):
    data, _ = make_batch(tokenizer, ROWS, R=24)
    rm = RewardManager(
        tokenizer,
        {"gsm8k": GSM8KReward(), "bad": scorer},
        default=["gsm8k", "bad"],
        num_workers=1,
    )
    with pytest.raises(RewardError, match=message):
        rm(data)


def test_a_slow_scorer_stops_at_batch_timeout_s(tokenizer):
    data, _ = make_batch(tokenizer, ROWS, R=24)
    rm = RewardManager(
        tokenizer, {"slow": Slow()}, default="slow", num_workers=1, batch_timeout_s=0.5
    )
    start = time.monotonic()
    with pytest.raises(
        RewardError,
        match=r"^reward 'slow' \(Slow.score_batch\) did not return within "
        r"reward.batch_timeout_s = 0.5 s \(3 rows\)",
    ):
        rm(data)
    assert time.monotonic() - start < 20  # not the scorer's 30 s (a stall check)


def test_a_timeout_limit_passes_a_prompt_scorer_through(tokenizer):
    data, _ = make_batch(tokenizer, ROWS, R=24)
    rm = RewardManager(
        tokenizer, {"judge": Judge()}, default="judge", num_workers=1, batch_timeout_s=30
    )
    out, _ = rm(data)
    assert list(out.non_tensor_batch["score"]) == [1.0, 0.25, 0.25, 0.0]


# --- discovery and conformance ---------------------------------------------------------------


class BatchedPlugin:
    contract_version = CONTRACT_VERSION

    @staticmethod
    @hookimpl
    def register_rewards():
        return {"judge_test": Judge, "not_a_reward": NotAReward}


class NotAReward:
    @attrs.frozen(kw_only=True)
    class Config:
        pass


def test_a_batched_scorer_registers_as_a_reward():
    reg = PluginRegistry(disabled=["rlcore-fake", "rlcore-fake-dup"])
    reg.register(BatchedPlugin(), name="batched-test")
    assert reg.resolve("reward", "judge_test") is Judge
    assert reg.resolve("reward", "gsm8k") is GSM8KReward
    with pytest.raises(PluginError, match=r"is not a subclass of rlcore.interfaces.BaseReward "
                       r"or rlcore.interfaces.BaseBatchReward$"):  # fmt: skip
        reg.resolve("reward", "not_a_reward")


def test_conformance_passes_good_scorers_and_names_a_bad_one():
    from rlcore.testing.conformance import check_batch_reward, make_reward_batch

    check_batch_reward(Judge, cases=[("#### 7", "7", 1.0), ("#### 8", "7", 0.25)])
    check_batch_reward(PerToken, cases=[("ab", "x", 0.2)])
    with pytest.raises(AssertionError, match=r"author case scored wrong: case 0"):
        check_batch_reward(Judge, cases=[("#### 7", "7", 0.5)])
    with pytest.raises(AssertionError, match=r"one finite score per row .*shape \(10,\)"):
        check_batch_reward(WrongShape)
    with pytest.raises(AssertionError, match=r"must not raise: .*ConnectionError"):
        check_batch_reward(Raises)
    batch = make_reward_batch([("hello", "x"), ("", "y")], response_length=4)
    assert batch.response_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert batch.responses == ("hello", "")
