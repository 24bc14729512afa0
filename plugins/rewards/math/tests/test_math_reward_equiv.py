from __future__ import annotations

import subprocess
import sys

import attrs
import pytest

from rlcore_math import check_equiv, is_equiv, normalize_answer
from rlcore_math.reward import MathReward

EQUAL = [
    # normalisation: \left/\right, \dfrac/\tfrac, \frac12, a/b, spaces
    ("\\left( 3, \\dfrac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("\\tfrac{3}{4}", "3/4"),
    ("\\sqrt2", "\\sqrt{2}"),
    # units and \text{}, degrees, percentages
    ("5\\text{ cm}^2", "5"),
    ("12 dollars", "12"),
    ("6.5 \\mathrm{~m}", "6.5"),
    ("\\text{(C)}", "(C)"),
    ("30^\\circ", "30"),
    ("30^{\\circ}", "30"),
    ("50\\%", "50"),
    # x= prefixes, leading zeros, thousands separators
    ("x = 5", "5"),
    ("y=\\frac{1}{2}", "0.5"),
    ("025", "25"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    ("\\textbf{(113) }", "113"),
    # numbers: integers, decimals, fractions, scientific notation
    ("10", "10.0"),
    ("-.5", "-\\frac12"),
    ("0.5", "\\frac{1}{2}"),
    ("1.6e-19", "1.6 \\times 10^{-19}"),
    ("3\\times10^{8}", "300000000"),
    ("4e33", "4 \\times 10^{33}"),
    # tuples and intervals
    ("[1, 2)", "\\left[1,2\\right)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("(0.5, 2)", "(\\frac{1}{2}, 2)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    # symbolic equality (math-verify / sympy)
    ("2\\sqrt{3}", "\\sqrt{12}"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{1}{2}\\pi", "\\frac{\\pi}{2}"),
    # unit powers dropped when only one side states a unit; bases written the same way
    ("864", "864 \\mbox{ inches}^2"),
    ("864 \\text{ inches}^{2}", "864 \\mbox{ inches}^2"),
    ("52_{9}", "52_9"),
    ("\\$36", "36"),
    # a text command around math; subscripted symbols renamed consistently
    ("\\text{3\\sqrt{13}}", "3\\sqrt{13}"),
    ("\\frac{2}{6} E_{1}+\\frac{2}{3} E_{2}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}"),
]

DIFFERENT = [
    ("1", "2"),
    ("0.333", "\\frac13"),
    ("(1,2)", "[1,2]"),
    ("(1,2)", "(2,1)"),
    ("x^2", "x^3"),
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("2", "\\sqrt{4}+1"),
    ("25", "025.5"),
    ("", "1"),
    # issue 11: unit exponents, number bases, subscripted symbols, failed parses
    ("864 \\mbox{ inches}^3", "864 \\mbox{ inches}^2"),
    ("864 \\mbox{ inches}^7", "864 \\mbox{ inches}^2"),
    ("15 \\text{ cubic feet}", "15 \\text{ square feet}"),
    ("52_9", "52_8"),
    ("1011_{2}", "1011_{3}"),
    ("52", "52_8"),
    ("\\frac{1}{4} E_{1}+\\frac{2}{3} E_{2}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}"),
    (
        "m_{p} c^{2}\\left(\\gamma^{2}-2\\right) \\sin ^{2} \\theta",
        "m_{p} c^{2}\\left(\\gamma^{2}-1\\right) \\sin ^{2} \\theta",
    ),
]


@pytest.mark.parametrize(("pred", "ref"), EQUAL)
def test_equal_answers(pred, ref):
    assert is_equiv(pred, ref), check_equiv(pred, ref)
    assert is_equiv(ref, pred)


@pytest.mark.parametrize(("pred", "ref"), DIFFERENT)
def test_different_answers(pred, ref):
    assert not is_equiv(pred, ref), check_equiv(pred, ref)


def test_without_math_verify_symbolic_needs_it():
    assert not is_equiv("2\\sqrt{3}", "\\sqrt{12}", use_math_verify=False)
    assert is_equiv("\\dfrac{1}{2}", "0.5", use_math_verify=False)


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("\\left( 3, \\dfrac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
        ("x = 025^\\circ", "25"),
        ("10\\%", "10"),
        ("1,000", "1000"),
        ("\\boxed{\\frac12}", "\\frac{1}{2}"),
        ("7/3", "\\frac{7}{3}"),
        (".5", "0.5"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_score_dict_and_scores():
    reward = MathReward(MathReward.Config(score=1.0, format_score=-0.5))
    right = reward.score("math", "so $\\boxed{\\dfrac{1}{2}}$", "\\frac12")
    assert right == {"score": 1.0, "acc": True, "pred": "\\dfrac{1}{2}"}
    wrong = reward.score("math", "so $\\boxed{3}$", "4")
    assert wrong == {"score": -0.5, "acc": False, "pred": "3"}
    missing = reward.score("math", "no answer", "4")
    assert missing == {"score": 0.0, "acc": False, "pred": None}
    # AMC stores answers as floats; lists hold alternatives; references may be boxed.
    assert reward.score("amc23", "\\boxed{27}", 27.0)["acc"]
    assert reward.score("x", "\\boxed{b}", ["a", "b"])["acc"]
    assert reward.score("x", "\\boxed{5}", "\\boxed{5}")["acc"]


def test_answer_mode():
    reward = MathReward(MathReward.Config(extract="answer"))
    text = "Final Answer: The final answer is $42$. I hope it is correct."
    assert reward.score("minerva", text, "42")["acc"]


def test_config_validation():
    with pytest.raises(ValueError):
        MathReward.Config(extract="last")
    with pytest.raises(ValueError):
        MathReward.Config(timeout_s=0.0)
    assert attrs.has(MathReward.Config)
    with pytest.raises(TypeError):
        MathReward.Config("boxed")  # kw_only


def test_plugin_registration_is_light():
    code = (
        "import sys, importlib.metadata as md\n"
        "eps = [e for e in md.entry_points(group='rlcore') if e.name == 'math']\n"
        "assert eps, 'entry point rlcore:math missing (pip install -e plugins/rewards/math)'\n"
        "mod = eps[0].load()\n"
        "import rlcore_math\n"
        "assert mod.register_rewards() == {'math': 'rlcore_math.reward:MathReward'}\n"
        "heavy = [m for m in ('torch', 'sympy', 'math_verify', 'ray') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
