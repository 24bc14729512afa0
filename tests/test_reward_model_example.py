"""examples/reward_model/train_rm.py trains the score the run reads: for the same (prompt,
response) rows, the score its training loop computes is the score the reward-model role gives
(``rm_inputs`` on the policy's rollout tensors, then FSDP2's ``score_rows``), read at the same
token: the response's end-of-turn token, not a pad and not the token before it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "reward_model"
QUICKSTART = REPO / "examples" / "quickstart"


def _load(folder: Path, name: str):
    sys.path.insert(0, str(QUICKSTART))  # train_rm.py imports prepare.py, its sibling's
    try:
        spec = importlib.util.spec_from_file_location(f"rm_example_{name}", folder / f"{name}.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(QUICKSTART))
    return module


def _rollout(tokenizer, prompts: list[list[int]], responses: list[list[int]], R: int):
    """The rollout's layout: prompts left-padded, responses right-padded with the pad id after
    the end-of-turn token (masked), positions continuing past it."""
    from rlcore.engine import rollout_tensors
    from rlcore.protocol import DataProto

    pad = tokenizer.pad_token_id
    P = max(len(p) for p in prompts)
    p_ids = torch.full((len(prompts), P), pad)
    p_mask = torch.zeros(len(prompts), P, dtype=torch.long)
    r_ids = torch.full((len(prompts), R), pad)
    r_mask = torch.zeros(len(prompts), R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_ids[i, P - len(p) :], p_mask[i, P - len(p) :] = torch.tensor(p), 1
        r_ids[i, : len(r)], r_mask[i, : len(r)] = torch.tensor(r), 1
    p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors=rollout_tensors(p_ids, p_mask, p_pos, r_ids, r_mask))


def test_train_rm_and_the_reward_model_role_score_the_same_token(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlcore.protocol import DataProto
    from rlcore.reward.model import at_last_token, rm_inputs
    from rlcore.testing.tiny_model import build_tiny_reward_model
    from rlcore_fsdp2.reward_head import score_rows

    torch.manual_seed(0)
    train_rm = _load(EXAMPLE, "train_rm")
    prepare = _load(QUICKSTART, "prepare")
    lm = _load(QUICKSTART, "make_model").make_model(tmp_path / "lm", seed=0)
    rm_path = build_tiny_reward_model(tmp_path / "rm", from_model=lm, seed=0)
    rm = AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    tok = AutoTokenizer.from_pretrained(rm_path)
    eos = tok.eos_token_id

    pairs = [(12, 34), (5, 6), (99, 99), (0, 7)]
    texts = ["12 + 34 = 46\n#### 46", "5 + 6 = 12\n#### 12", "99 + 99 = 198\n#### 198", "7"]
    prompts = [tok(prepare._prompt_text(tok, a, b))["input_ids"] for a, b in pairs]
    responses = [tok(t)["input_ids"] + [eos] for t in texts]
    responses[3] = responses[3][:-1]  # one cut at max_response_length: no end-of-turn token
    # train_rm.py's rows: prompt + response (+ eos), left-padded, the score at the last position.
    rows = [(p + r, 1, 1.0, "right", i) for i, (p, r) in enumerate(zip(prompts, responses))]
    with torch.no_grad():
        trained = train_rm.scores(rm, *train_rm.left_padded(rows, tok.pad_token_id)[:3])

    # The role: the rollout's tensors (responses right-padded with pad), the same tokenizer.
    data = _rollout(tok, prompts, responses, R=24)
    inputs = rm_inputs(data, policy_tokenizer=tok, rm_tokenizer=tok, retokenize=False)
    served = score_rows(
        rm, DataProto.from_dict(tensors=inputs), torch.device("cpu"),
        micro_batch_size=3, max_tokens_per_micro_batch=None,
    )  # fmt: skip
    torch.testing.assert_close(served, trained, atol=1e-5, rtol=1e-5)
    # ... and it lands on each response's last valid token (the end-of-turn token).
    placed = at_last_token(served, data.batch["response_mask"])
    for i, r in enumerate(responses):
        assert placed[i, len(r) - 1] == served[i]
        assert data.batch["responses"][i, len(r) - 1] == (eos if i < 3 else r[-1])
    # Not a constant: the rows' scores differ (the head does not read a shared pad position).
    assert float(served.std()) > 0
