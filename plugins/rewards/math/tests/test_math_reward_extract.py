from __future__ import annotations

import pytest

from rlcore_math import extract_answer, last_boxed_only_string, remove_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so $\\boxed{5}$.", "\\boxed{5}"),
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}} done", "\\boxed{\\frac{1}{2}}"),
        ("nested \\boxed{\\left\\{ x^{2} \\right\\}}", "\\boxed{\\left\\{ x^{2} \\right\\}}"),
        ("escaped brace \\boxed{\\{1, 2\\}}", "\\boxed{\\{1, 2\\}}"),
        ("space form $\\boxed 7$ end", "\\boxed 7"),
        ("escaped dollar $\\boxed \\$36$ end", "\\boxed \\$36"),
        ("escaped dollar at the end \\boxed \\$36", "\\boxed \\$36"),
        ("fbox \\fbox{12}", "\\fbox{12}"),
        ("\\boxed{1} later \\fbox{2}", "\\fbox{2}"),
        ("no box here", None),
        ("cut off \\boxed{\\frac{1}{2}", None),
        ("\\boxed{1} and a truncated \\boxed{2", None),
        ("\\boxed", None),
    ],
)
def test_last_boxed_only_string(text, expected):
    assert last_boxed_only_string(text) == expected


@pytest.mark.parametrize(
    ("boxed", "inner"),
    [
        ("\\boxed{5}", "5"),
        ("\\boxed 7", "7"),
        ("\\fbox{x+1}", "x+1"),
        ("\\boxed{{a}}", "{a}"),
        ("42", "42"),
    ],
)
def test_remove_boxed(boxed, inner):
    assert remove_boxed(boxed) == inner


def test_extract_modes():
    minerva = "Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct."
    assert extract_answer(minerva, "answer") == "\\frac{3}{4}"
    assert extract_answer(minerva, "boxed") is None
    assert extract_answer(minerva, "both") == "\\frac{3}{4}"
    boxed_and_line = "\\boxed{2}\nAnswer: 3"
    assert extract_answer(boxed_and_line, "both") == "2"
    assert extract_answer(boxed_and_line, "answer") == "3"
    assert extract_answer("blah\nAnswer: $x = 4$.", "answer") == "x = 4"
    assert extract_answer("The final answer is \\boxed{10}.", "answer") == "10"
    assert extract_answer("", "both") is None
    assert extract_answer("\\boxed{}", "boxed") is None
