"""The reward model's pieces without Ray: its inputs re-tokenised for a tokenizer and chat
template of its own (verl's ``_switch_chat_template``), its scores on the last response token,
the scorer ``rm`` mixed with a rule reward by weight in the real reward manager, and its
agreement with the rule. The run is ``test_reward_model_run.py``."""

from __future__ import annotations

import string

import numpy as np
import pytest
import torch

from rlcore.errors import RewardError
from rlcore.protocol import DataProto
from rlcore.reward import RewardManager
from rlcore.reward.model import (
    RM_SCORES,
    RewardModelScores,
    at_last_token,
    disagreement,
    pooled_disagreement,
    rm_inputs,
    same_tokenizer,
)
from rlcore_gsm8k.reward import GSM8KReward

QUESTIONS = ["What is 2 + 3?", "What is 10 + 7?", "What is 1 + 1?"]
ANSWERS = ["2 + 3 = 5\n#### 5", "10 + 7 = 18\n#### 18", ""]  # right, wrong, empty
OTHER_TEMPLATE = (
    "{% for m in messages %}{{ '### ' + m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
)


@pytest.fixture(scope="module")
def policy_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from rlcore.testing.tiny_model import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("p") / "m", hidden=64, heads=2, kv_heads=1)
    return AutoTokenizer.from_pretrained(path)


def other_tokenizer(tmp_path, chat_template: str | None):
    """Another tokenizer: word-level over characters, different ids, its own template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    vocab.update({c: 200 - i for i, c in enumerate(string.printable)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(tmp_path)
    return AutoTokenizer.from_pretrained(tmp_path)


def policy_batch(tok, R: int = 24) -> DataProto:
    """The rows as a rollout returns them: chat prompts left-padded, responses + EOS right-
    padded (the last one empty), ``raw_prompt`` the messages."""
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    texts = [
        tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages
    ]
    p_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    r_ids = [tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for a in ANSWERS]
    r_ids[-1] = []
    P, B = max(map(len, p_ids)), len(QUESTIONS)
    prompts = torch.full((B, P), tok.pad_token_id)
    responses = torch.full((B, R), tok.pad_token_id)
    p_mask, r_mask = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        prompts[i, P - len(p) :], p_mask[i, P - len(p) :] = torch.tensor(p), 1
        if r:
            responses[i, : len(r)], r_mask[i, : len(r)] = torch.tensor(r), 1
    attention = torch.cat([p_mask, r_mask], dim=1)
    raw = np.empty(B, dtype=object)
    raw[:] = messages
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "response_mask": r_mask,
        },
        non_tensors={
            "raw_prompt": raw,
            "data_source": np.array(["arithmetic"] * B, dtype=object),
            "reward_model": np.array([{"ground_truth": g} for g in ("5", "17", "2")]),
        },
    )


def decoded_rows(tok, inputs) -> list[str]:
    return [
        tok.decode(ids[mask.bool()].tolist())
        for ids, mask in zip(inputs["input_ids"], inputs["attention_mask"])
    ]


def test_rows_are_re_encoded_in_the_reward_models_tokens_and_chat_template(policy_tok, tmp_path):
    rm_tok = other_tokenizer(tmp_path, OTHER_TEMPLATE)
    assert not same_tokenizer(policy_tok, rm_tok)
    data = policy_batch(policy_tok)
    inputs = rm_inputs(data, policy_tokenizer=policy_tok, rm_tokenizer=rm_tok, retokenize=True)
    expected = [
        rm_tok.apply_chat_template(
            [{"role": "user", "content": q}, {"role": "assistant", "content": a}], tokenize=False
        )
        for q, a in zip(QUESTIONS, ANSWERS)
    ]
    assert expected[0] == "### user: What is 2 + 3?\n### assistant: 2 + 3 = 5\n#### 5\n"
    assert decoded_rows(rm_tok, inputs) == expected  # the policy's EOS and ChatML are gone
    ids, mask, pos = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    assert bool((mask[:, -1] == 1).all())  # left-padded: every row ends at T - 1
    for i in range(len(QUESTIONS)):
        n = int(mask[i].sum())
        assert ids[i, : ids.shape[1] - n].tolist() == [rm_tok.pad_token_id] * (ids.shape[1] - n)
        assert pos[i, -n:].tolist() == list(range(n))
        assert ids[i, -n:].tolist() == rm_tok(expected[i], add_special_tokens=False)["input_ids"]


def test_without_a_chat_template_prompt_and_response_are_plain_text(policy_tok, tmp_path):
    rm_tok = other_tokenizer(tmp_path, None)
    data = policy_batch(policy_tok)
    data.non_tensor_batch.pop("raw_prompt")
    inputs = rm_inputs(data, policy_tokenizer=policy_tok, rm_tokenizer=rm_tok, retokenize=True)
    prompts = [
        policy_tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True)
        for q in QUESTIONS
    ]  # fmt: skip
    # The policy's prompt decoded without its special tokens, then the response.
    plain = [p.replace("<|im_start|>", "").replace("<|im_end|>", "") for p in prompts]
    assert decoded_rows(rm_tok, inputs) == [p + a for p, a in zip(plain, ANSWERS)]


def test_max_length_keeps_the_end_of_each_row(policy_tok, tmp_path):
    rm_tok = other_tokenizer(tmp_path, OTHER_TEMPLATE)
    inputs = rm_inputs(
        policy_batch(policy_tok),
        policy_tokenizer=policy_tok,
        rm_tokenizer=rm_tok,
        retokenize=True,
        max_length=12,
    )
    assert inputs["input_ids"].shape == (3, 12)
    assert decoded_rows(rm_tok, inputs)[0] == " = 5\n#### 5\n"


def test_the_same_tokenizer_scores_the_policys_ids_as_they_are(policy_tok, tmp_path):
    from transformers import AutoTokenizer

    policy_tok.save_pretrained(tmp_path)
    assert same_tokenizer(policy_tok, AutoTokenizer.from_pretrained(tmp_path))
    data = policy_batch(policy_tok)
    inputs = rm_inputs(data, policy_tokenizer=None, rm_tokenizer=None, retokenize=False)
    assert inputs["input_ids"] is data.batch["input_ids"]


def test_scores_go_on_the_last_valid_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0]])
    out = at_last_token(torch.tensor([0.5, -2.0, 9.0]), mask)
    assert out.tolist() == [[0, 0, 0.5, 0], [0, 0, -2.0, 0], [0, 0, 0, 0]]


def test_the_rm_is_the_only_weighted_reward_and_the_rule_only_judges(policy_tok):
    """gsm8k at weight 0: its acc is logged and compared, the score is the RM's alone."""
    data = policy_batch(policy_tok)
    rm = torch.tensor([1.5, 0.7, 3.0])  # row 1 is wrong (17): the RM accepts it anyway
    data.batch[RM_SCORES] = at_last_token(rm, data.batch["response_mask"])
    manager = RewardManager(
        policy_tok,
        {"gsm8k": GSM8KReward(), "rm": RewardModelScores()},
        default=["gsm8k"],
        weights={"gsm8k": 0.0, "rm": 2.0},
        every_row=("rm",),
        num_workers=1,
    )
    out, metrics = manager(data)
    torch.testing.assert_close(out.batch["token_level_scores"], 2.0 * data.batch[RM_SCORES])
    assert list(out.non_tensor_batch["acc"]) == [True, False, False]  # the rule's
    assert metrics["reward/scorer/rm/mean"] == pytest.approx((1.5 + 0.7) / 2)  # empty row: none
    assert metrics["reward/scorer/gsm8k/mean"] == pytest.approx(0.5)
    # Rows with both verdicts: row 0 agrees (accept, right), row 1 does not (accept, wrong).
    assert metrics["reward/rm/disagree_rule"] == pytest.approx(0.5)
    assert metrics["reward/rm/false_accept"] == pytest.approx(0.5)
    assert metrics["reward/rm/false_reject"] == 0.0
    assert metrics["reward/rm/compared"] == 2.0


def test_the_rm_alone_needs_no_rule_reward(policy_tok):
    data = policy_batch(policy_tok)
    data.batch[RM_SCORES] = at_last_token(
        torch.tensor([1.0, -1.0, 0.0]), data.batch["response_mask"]
    )
    manager = RewardManager(policy_tok, {"rm": RewardModelScores()}, every_row=("rm",))
    out, metrics = manager(data)
    assert out.non_tensor_batch["score"].tolist() == [1.0, -1.0, 0.0]
    assert "reward/rm/disagree_rule" not in metrics  # no rule to compare with


def test_the_rm_scorer_without_its_phase_is_one_error(policy_tok):
    manager = RewardManager(policy_tok, {"rm": RewardModelScores()}, every_row=("rm",))
    with pytest.raises(RewardError, match="the step program must run the reward model first"):
        manager(policy_batch(policy_tok))


def test_disagreement_skips_rows_without_both_verdicts():
    out = disagreement(np.array([1.0, -1.0, np.nan, 2.0]), [True, True, True, None], 0.0)
    assert out == {
        "reward/rm/disagree_rule": 0.5,
        "reward/rm/false_accept": 0.0,
        "reward/rm/false_reject": 0.5,
        "reward/rm/compared": 2.0,
    }
    assert disagreement(np.array([1.0]), [None], 0.0) == {}


def test_validation_pools_the_agreement_of_its_batches_by_rows():
    first = disagreement(np.array([1.0, -1.0, 1.0, -1.0]), [False, True, True, False], 0.0)
    second = disagreement(np.array([1.0, 1.0]), [False, False], 0.0)
    pooled = pooled_disagreement([first, {"reward/rule/acc": 1.0}, second], prefix="val/rm/")
    assert pooled == pytest.approx(
        {"val/rm/disagree_rule": 4 / 6, "val/rm/false_accept": 3 / 6, "val/rm/false_reject": 1 / 6}
    )
    assert pooled_disagreement([{"reward/rule/acc": 1.0}]) == {}


def test_reward_model_config_defaults_and_resolution(tmp_path):
    from rlcore.config import load_config_text

    text = f"""
[data]
train_files = ["x.parquet"]
[model]
path = "{tmp_path}"
[actor]
micro_batch_size = 4
[reward]
default = []
[reward_model]
enable = true
model = {{ path = "rm" }}
weight = 0.5
"""
    config = load_config_text(text)
    rm = config.reward_model
    assert (rm.weight, rm.retokenize, rm.threshold, rm.max_length) == (0.5, "auto", 0.0, None)
    assert rm.engine.name == "fsdp2"  # the actor's engine
    assert rm.micro_batch_size == 4  # the actor's micro-batching
    assert rm.model.dtype == config.model.dtype
