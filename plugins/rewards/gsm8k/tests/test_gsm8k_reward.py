"""GSM8K reward: verl's semantics, the real test set, and adversarial inputs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcore_gsm8k import GSM8KReward, compute_score, extract_solution

DATA = Path(__file__).resolve().parents[4] / ".." / "shared" / "data" / "gsm8k"
TIME_LIMIT_S = 5.0  # the reward manager's default per-sample limit


def _ground_truth(solution: str) -> str:
    # The data-preparation rule: the text after "####", commas removed.
    return solution.split("####")[-1].strip().replace(",", "")


@pytest.fixture(scope="module")
def test_rows() -> list[dict[str, str]]:
    path = DATA / "test.jsonl"
    if not path.exists():
        pytest.skip(f"real GSM8K data not found at {path}")
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the real test set ----------------------------------------------------------------------


def test_every_reference_solution_scores_one(test_rows):
    reward = GSM8KReward()
    scores = [
        reward.score("openai/gsm8k", r["answer"], _ground_truth(r["answer"])) for r in test_rows
    ]
    assert len(test_rows) == 1319
    assert sum(s["score"] for s in scores) == 1319.0
    assert all(s["acc"] for s in scores)


def test_reference_solution_against_another_rows_answer(test_rows):
    reward = GSM8KReward()
    truths = [_ground_truth(r["answer"]) for r in test_rows]
    n = len(test_rows)
    hits = 0
    for shift in (1, 7, 500):
        for i, row in enumerate(test_rows):
            other = truths[(i + shift) % n]
            got = reward.score("openai/gsm8k", row["answer"], other)["score"]
            assert got == (1.0 if other == truths[i] else 0.0), (i, truths[i], other)
            hits += got == 1.0
    # Some rows do share an answer; the check above says they, and only they, score 1.
    assert 0 < hits < n


def test_flexible_also_scores_all_references(test_rows):
    reward = GSM8KReward(GSM8KReward.Config(method="flexible"))
    assert all(
        reward.score("openai/gsm8k", r["answer"], _ground_truth(r["answer"]))["acc"]
        for r in test_rows
    )


# --- semantics ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("so 3 + 4 = 7\n#### 7", "7", "7"),
        ("#### 5 then more text with 9", "5", "9"),
        ("no marker, the answer is 12", None, "12"),
        ("#### -3", "-3", "-3"),
        ("#### -0.5", "-0.5", "-0.5"),
        ("#### 2.75", "2.75", "2.75"),
        ("#### 1,234,567", "1234567", "1234567"),
        ("#### $18", "18", "18"),
        ("She makes $1,018 a day.", None, "1018"),
        ("She makes $1,018.", None, "1018."),  # verl keeps a trailing period
        ("#### 4\nwait, no.\n#### 6", "6", "6"),  # the last marker wins
        ("####7", None, "7"),  # strict needs the space, as in verl
        ("nothing numeric here.", None, None),
        ("", None, None),
        ("a , b . c", None, None),  # tokens without a digit are not answers
    ],
)
def test_extract_strict_and_flexible(text, strict, flexible):
    assert extract_solution(text, "strict") == strict
    assert extract_solution(text, "flexible") == flexible


def test_only_the_last_300_characters_are_searched():
    answer = "#### 42"
    assert extract_solution(answer + " " + "x" * 292, "strict") == "42"  # 300 chars: in
    assert extract_solution(answer + " " + "x" * 293, "strict") is None  # 301: the # is cut
    assert extract_solution("#### 42" + "." * 5000, "strict") is None
    # A cut through the number keeps its tail, exactly as verl's clipping does.
    assert extract_solution("#### 123" + "y" * 299, "flexible") == "3"


def test_scores_correct_wrong_and_missing():
    cfg = GSM8KReward.Config(score=2.0, format_score=0.1)
    reward = GSM8KReward(cfg)
    assert reward.score("openai/gsm8k", "#### 10", "10") == {
        "score": 2.0,
        "acc": True,
        "pred": "10",
    }
    assert reward.score("openai/gsm8k", "#### 11", "10") == {
        "score": 0.1,
        "acc": False,
        "pred": "11",
    }
    assert reward.score("openai/gsm8k", "ten", "10") == {"score": 0.0, "acc": False, "pred": None}
    # Ground truth is normalised too; comparison is of strings, like verl.
    assert reward.score("openai/gsm8k", "#### 1000", "1,000")["acc"]
    assert not reward.score("openai/gsm8k", "#### 18.0", "18")["acc"]
    assert compute_score("#### 7", "7") == 1.0
    assert compute_score("#### 8", "7", format_score=0.5) == 0.5
    assert compute_score("seven", "7", format_score=0.5) == 0.0


def test_negative_answers_must_match_sign():
    reward = GSM8KReward()
    assert reward.score("openai/gsm8k", "#### -4", "-4")["acc"]
    assert not reward.score("openai/gsm8k", "#### 4", "-4")["acc"]


def test_config_rejects_unknown_method():
    with pytest.raises(ValueError, match="method"):
        GSM8KReward.Config(method="loose")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        GSM8KReward.Config().score = 3.0  # type: ignore[misc]


def test_plugin_module_imports_nothing_heavy():
    code = (
        "import sys, rlcore_gsm8k.plugin as p, rlcore_gsm8k.reward;"
        "print(p.register_rewards());"
        "assert not {'torch', 'transformers', 'ray'} & set(sys.modules), sorted(sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "rlcore_gsm8k.reward:GSM8KReward" in out.stdout


# --- adversarial inputs ---------------------------------------------------------------------

ADVERSARIAL = [
    "{" * 100_000,
    "9" * 100_000,
    "#### " + "9" * 100_000,
    "\\boxed{" * 5_000,
    "-" * 100_000 + "1",
    "#### " * 30_000,
    "1," * 50_000,
    ("$" + "." * 3) * 20_000,
    "\x00\ud7ff\n" * 1000,
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: repr(t[:12]))
@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_adversarial_inputs_return_quickly(text, method):
    reward = GSM8KReward(GSM8KReward.Config(method=method))
    start = time.perf_counter()
    out = reward.score("openai/gsm8k", text, "42")
    assert time.perf_counter() - start < TIME_LIMIT_S
    assert out["score"] in (0.0, 1.0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.one_of(
        st.text(max_size=2000),
        st.text(alphabet="#$,.-0123456789 {}\\boxed\n", max_size=2000),
        st.builds(
            lambda a, b: a + "#### " + b,
            st.text(max_size=400),
            st.text("0123456789,.-$", max_size=40),
        ),
    ),
    truth=st.text("0123456789,.-", max_size=12),
    method=st.sampled_from(["strict", "flexible"]),
)
def test_random_strings_never_raise(text, truth, method):
    reward = GSM8KReward(GSM8KReward.Config(method=method, format_score=0.25))
    start = time.perf_counter()
    out = reward.score("openai/gsm8k", text, truth)
    assert time.perf_counter() - start < TIME_LIMIT_S
    assert out["score"] in (0.0, 0.25, 1.0)
    assert (out["pred"] is None) == (out["score"] == 0.0)
    assert out["acc"] == (out["score"] == 1.0)
