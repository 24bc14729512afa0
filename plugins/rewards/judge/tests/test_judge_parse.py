"""The judge's template check and score parser: many formats, hostile outputs, never a raise."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcore_judge.parse import (
    DEFAULT_TEMPLATE,
    ScoreParser,
    check_pattern,
    check_template,
    render,
    template_fields,
)

parse = ScoreParser()  # [[x]] on a 0..10 scale


@pytest.mark.parametrize(
    ("text", "score", "raw"),
    [
        ("Rating: [[7]]", 0.7, 7.0),
        ("[[10]]", 1.0, 10.0),
        ("[[0]]", 0.0, 0.0),
        ("[[ 8.5 ]]", 0.85, 8.5),
        ("[[+3]]", 0.3, 3.0),
        ("The answer is right.\n\nRating: [[9]]\n", 0.9, 9.0),
        ("format: [[5]] ... final: [[2]]", 0.2, 2.0),  # the last match wins
        ("[[3]] [[x]] [[]]", 0.3, 3.0),
        ("Ｒating [[6]] — 良い", 0.6, 6.0),
    ],
)
def test_the_default_format(text, score, raw):
    j = parse(text)
    assert j.status == "ok"
    assert j.parsed
    assert j.score == pytest.approx(score)
    assert j.raw == raw


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no number at all",
        "7",  # no brackets: the default pattern only
        "[7]",
        "[[seven]]",
        "[[NaN]]",
        "[[nan]]",
        "[[inf]]",
        "[[-inf]]",
        "[[1e999]]",
        "[[1_000]]",
        "[[0x10]]",
        "[[" + "9" * 10_000 + "]]",  # a 10,000-digit number
        "[[[[[[" * 5_000,  # bracket soup
        "\x00\xff\ud800 [[\x00]]",  # NUL, a lone surrogate
        None,
        b"[[7]]",
        7,
        float("nan"),
    ],
)
def test_hostile_outputs_are_unparseable_never_raise(text):
    j = parse(text)
    assert j.status == "unparseable"
    assert j.score == 0.0
    assert not j.parsed
    assert j.raw is None


@pytest.mark.parametrize(
    ("text", "raw"), [("[[11]]", 11.0), ("[[-1]]", -1.0), ("[[99999]]", 99999.0)]
)
def test_out_of_scale_is_unparseable_by_default_and_clamped_on_request(text, raw):
    j = parse(text)
    assert (j.status, j.score, j.raw) == ("out_of_range", 0.0, raw)
    clamp = ScoreParser(out_of_range="clamp")(text)
    assert clamp.status == "ok"
    assert clamp.score == (1.0 if raw > 10 else 0.0)
    assert clamp.raw == raw


def test_a_configured_default_score_for_unparseable():
    j = ScoreParser(unparseable_score=0.5)("gibberish")
    assert (j.status, j.score) == ("unparseable", 0.5)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("The answer is correct. Score: 4", 0.8),
        ("I give it 3.5 out of\n5: 2", 0.4),  # the final number
        ("score -1", None),  # out of scale
        ("nothing", None),
    ],
)
def test_the_final_number_fallback(text, score):
    p = ScoreParser(last_number=True, scale=(0, 5))
    j = p(text)
    if score is None:
        assert not j.parsed
    else:
        assert j.parsed
        assert j.score == pytest.approx(score)


def test_the_pattern_still_wins_over_the_final_number():
    assert ScoreParser(last_number=True)("[[6]] out of 10").score == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("pattern", "text", "score"),
    [
        (r"Score:\s*(\d+)", "Score: 3", 0.75),
        (r"\d+/4", "3/4 rubric", None),  # no group: the whole match "3/4" is not a number
        (r"(?i)verdict\s*=\s*(\d)", "VERDICT = 2", 0.5),
        (r"<score>(.*?)</score>", "<score>nan</score>", None),  # a group may catch junk
        (r"<score>(.*?)</score>", "<score> 1 </score>", 0.25),
    ],
)
def test_a_configured_pattern(pattern, text, score):
    j = ScoreParser(pattern, scale=(0, 4))(text)
    if score is None:
        assert j.status == "unparseable"
    else:
        assert j.score == pytest.approx(score)


def test_a_pattern_with_no_group_reads_the_whole_match():
    assert ScoreParser(r"\b\d\b", scale=(0, 9))("grade 6").score == pytest.approx(6 / 9)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("([", "is not a valid regular expression"), (r"(\d)/(\d)", "has 2 capture groups")],
)
def test_bad_patterns(pattern, why):
    with pytest.raises(ValueError, match=why):
        check_pattern(pattern)


@pytest.mark.parametrize("scale", [(1, 1), (5, 0), (0, math.inf), (math.nan, 1)])
def test_bad_scales(scale):
    with pytest.raises(ValueError, match="scale must be"):
        ScoreParser(scale=scale)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_gives_a_score_in_range(text):
    j = ScoreParser(last_number=True)(text)
    assert math.isfinite(j.score)
    assert 0.0 <= j.score <= 1.0
    assert j.status in ("ok", "unparseable", "out_of_range")


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=10, allow_nan=False), st.text(max_size=50))
def test_a_bracketed_number_is_read_back(x, noise):
    text = f"{noise.replace('[', '').replace(']', '')} [[{x:.3f}]]"
    assert ScoreParser()(text).score == pytest.approx(float(f"{x:.3f}") / 10)


# --- the template -----------------------------------------------------------------------------


def test_the_default_template_is_valid_and_renders():
    check_template(DEFAULT_TEMPLATE)
    assert template_fields(DEFAULT_TEMPLATE) == ["prompt", "ground_truth", "response"]
    text = render(DEFAULT_TEMPLATE, prompt="What is 1 + 1?", response="{2}", ground_truth=2)
    assert "What is 1 + 1?" in text
    assert "Answer to grade:\n{2}" in text  # braces in a value are kept as they are
    assert "Reference answer: 2" in text


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("Rate this: {prompt}", "has no {response} placeholder"),
        ("no placeholders", "has no {response} placeholder"),
        ("{{response}}", "has no {response} placeholder"),  # a literal, not a placeholder
        ("{response} {answer}", "unknown placeholder {answer}"),
        ("{response} {}", "positional placeholder {}"),
        ("{response} {0}", "positional placeholder {0}"),
        ("{response} {", "is not a valid template"),
        ("{response} }", "is not a valid template"),
        ("{response.upper}", "unknown placeholder {response.upper}"),
        ("{response:{width}}", "nested placeholder"),
    ],
)
def test_bad_templates(template, why):
    with pytest.raises(ValueError) as info:
        check_template(template)
    assert why in str(info.value)
    assert "\n" not in str(info.value)


def test_a_template_with_only_the_response_and_literal_braces():
    check_template('Grade {response} as JSON {{"score": n}}')
    assert render('{{"a": {response}}}', prompt="", response="1", ground_truth=None) == '{"a": 1}'


# --- issue 50 item 6: ASCII digits only, bounded matching, a bounded batch -------------------


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (None, "[[٧]]"),  # Arabic-Indic seven: float() reads it as 7.0
        (None, "[[７]]"),  # fullwidth seven
        (r"Score:\s*(\d+)", "Score: ३"),  # Devanagari three, through a user pattern
    ],
)
def test_only_ascii_digits_are_numbers(pattern, text):
    parser = ScoreParser() if pattern is None else ScoreParser(pattern, scale=(0, 4))
    j = parser(text)
    assert (j.status, j.raw) == ("unparseable", None)
    assert ScoreParser(last_number=True, pattern=r"\[\[never\]\]")(text).status == "unparseable"


def test_a_pattern_that_backtracks_without_bound_is_cut_short():
    import time

    # Exponential in the text's length under the standard library's re: 60 characters of it
    # would run for hours. The regex package's per-parse timeout makes it one unparseable row.
    parser = ScoreParser(r"(a|aa)+$", scale=(0, 9))
    start = time.monotonic()
    j = parser("a" * 60 + "!")
    elapsed = time.monotonic() - start
    assert j.status == "unparseable"
    assert elapsed < 30  # ended at all (the bound is PARSE_TIMEOUT_S; not a speed test)
    assert parser("aaaa").status == "unparseable"  # "aaaa" matched, but it is not a number
    assert ScoreParser(r"(\d)+$", scale=(0, 9))("7").score == pytest.approx(7 / 9)


def test_batch_timeout_has_a_finite_default():
    from rlcore.config.schema import RewardConfig

    limit = RewardConfig().batch_timeout_s
    assert limit is not None
    assert math.isfinite(limit)
    assert limit > 0
