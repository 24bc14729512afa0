"""Random and adversarial model output never raises out of the scorer and stays in time."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcore_math import check_equiv, extract_answer, normalize_answer
from rlcore_math.reward import MathReward

TIMEOUT_S = 1.0
# Wall-clock slack over the limit: CI shares 2 cores between concurrent processes.
SLACK_S = 4.0

REWARD = MathReward(MathReward.Config(timeout_s=TIMEOUT_S, extract="both"))
REFERENCES = ["10", "\\frac{1}{2}", "x^2+1", "(1,2]", "2^{65536}", "\\sqrt{12}"]

ADVERSARIAL = [
    "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "\\boxed{" + "{" * 20_000,
    "\\boxed{" * 10_000,
    "9" * 100_000,
    "\\boxed{" + "9" * 100_000 + "}",
    "\\boxed{" + "9" * 900 + "}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{9^{9^{9}}}",
    "\\boxed{(10^{10})!}",
    "\\boxed{2^{2^{2^{2^{2}}}}}",
    "\\boxed{e^{10^{10}}}",
    "\\boxed{x^{100000}}",
    "\\boxed{(x+1)^{5000}}",
    "\\boxed{\\binom{10^{10}}{10^{5}}}",
    "\\boxed{\\sum_{i=1}^{10^{10}} i}",
    "\\boxed{\\prod_{i=1}^{10^{9}} i}",
    "\\boxed{\\int_0^{1} x^{x} dx}",
    "\\boxed{1e99999}",
    "\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}",
    "\\boxed{" + "\\frac{" * 300 + "}",
    "\\boxed{" + "+".join(["x"] * 400) + "}",
    "Answer: " + "{" * 3000,
    "Final Answer: The final answer is $" + "1" * 5000 + "$. I hope it is correct.",
    "\\boxed{\\sqrt{\\sqrt{\\sqrt{2}}}^{10000}}",
    "\\boxed{10^{9999}-10^{9998}}",
    "\\boxed{\\left(}",
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{0^{-1}}",
    "\\boxed{\x00\ud800}",
]

TOKENS = [
    "\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "(", ")", "[", "]", "\\frac", "\\dfrac", "^",
    "_", "!", "10", "9", "0", "1", ".", ",", "-", "+", "=", "x", "e", "\\sqrt", "\\left(",
    "\\right)", "\\%", "^\\circ", "\\text{", "$", "\\sum", "\\int", "\\pi", "\\infty", " ",
    "\\times", "Answer: ", "\\\\", "\\",
]  # fmt: skip


def _score_in_time(text: str, ref: str) -> dict:
    start = time.monotonic()
    out = REWARD.score("fuzz", text, ref)
    elapsed = time.monotonic() - start
    assert elapsed < TIMEOUT_S + SLACK_S, (elapsed, text[:200], ref)
    assert set(out) == {"score", "acc", "pred"}
    assert out["score"] in (0.0, 1.0)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs(text):
    for ref in REFERENCES:
        _score_in_time(text, ref)
    # The adversarial string as the reference is just as safe.
    _score_in_time("\\boxed{1}", text)


@pytest.mark.timeout(300)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(TOKENS), max_size=60).map("".join),
    st.sampled_from(REFERENCES),
)
def test_random_latex_token_soup(text, ref):
    _score_in_time(text, ref)
    _score_in_time("\\boxed{" + text + "}", ref)


@pytest.mark.timeout(300)
@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300), st.text(max_size=50))
def test_random_text(text, ref):
    out = _score_in_time(text, ref)
    assert out["pred"] is None or isinstance(out["pred"], str)
    normalize_answer(text)
    extract_answer(text, "answer")
    check_equiv(text[:100], ref, timeout_s=TIMEOUT_S)
