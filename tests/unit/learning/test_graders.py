"""Grading shadow pairs: verifiable answers directly, the rest by a judge asked in both orders."""

from __future__ import annotations

import pytest

from switchyard.learning.graders import (
    Answer,
    choice_of,
    final_number,
    grade,
    has_lettered_options,
    parse_verdict,
    render_conversation,
)

MCQ = "Which planet is largest?\nA) Mars\nB) Jupiter\nC) Venus\nD) Earth\nAnswer with the letter."
WORD_PROBLEM = "Tom has 3 boxes of 12 apples and eats 5. How many apples are left?"


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]


class ScriptedJudge:
    """A judge model's replies, in order; records what it was shown."""

    def __init__(self, *replies: str):
        self.replies = list(replies)
        self.shown: list[list[dict]] = []

    async def __call__(self, messages: list[dict]) -> str:
        self.shown.append(messages)
        return self.replies.pop(0)


async def test_multiple_choice_takes_the_strong_answer_as_the_reference():
    agree = await grade(ask(MCQ), (Answer("small", "B) Jupiter"), Answer("big", "The answer is B.")))
    assert agree is not None and agree.source == "verifiable"
    assert agree.quality == {"small": 1.0, "big": 1.0}
    differ = await grade(ask(MCQ), (Answer("small", "Answer: C"), Answer("big", "**B**")))
    assert differ is not None and differ.quality == {"small": 0.0, "big": 1.0}
    assert "multiple_choice" in differ.detail and "'C'" in differ.detail


async def test_a_word_problem_is_graded_on_the_final_number():
    label = await grade(
        ask(WORD_PROBLEM),
        (Answer("small", "3 * 12 = 36, minus 5 is 30.\nSo 30 apples."), Answer("big", "36 - 5 = 31\n#### 31")),
    )
    assert label is not None and label.source == "verifiable"
    assert label.quality == {"small": 0.0, "big": 1.0}
    same = await grade(ask(WORD_PROBLEM), (Answer("small", "The answer is 31"), Answer("big", "#### 31.0")))
    assert same is not None and same.quality == {"small": 1.0, "big": 1.0}


async def test_a_json_schema_request_grades_each_answer_on_its_own():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    label = await grade(
        ask("Give n as JSON"),
        (Answer("small", '{"n": "three"}'), Answer("big", '```json\n{"n": 3}\n```')),
        json_schema=schema,
    )
    assert label is not None and label.quality == {"small": 0.0, "big": 1.0}
    assert "schema:" in label.detail and "big: valid" in label.detail
    with pytest.raises(ValueError, match="needs the request's schema"):
        await grade(ask("x"), (Answer("a", "{}"), Answer("b", "{}")), kind="json_schema")


async def test_exact_compares_normalised_text_only_when_asked():
    label = await grade(
        ask("Classify the sentiment"), (Answer("small", "Positive."), Answer("big", "positive")), kind="exact"
    )
    assert label is not None and label.quality == {"small": 1.0, "big": 1.0}
    # the same pair under `auto` is open-ended: without a judge there is no label
    assert await grade(ask("Classify the sentiment"), (Answer("small", "Positive."), Answer("big", "positive"))) is None


async def test_the_judge_is_asked_in_both_orders_and_its_agreement_decides():
    weak, strong = Answer("small", "Paris is in Italy."), Answer("big", "Paris is in France.")
    judge = ScriptedJudge("B is right.\nVerdict: B", "Verdict: A")
    label = await grade(ask("Where is Paris?"), (weak, strong), judge=judge)
    assert label is not None and label.source == "judge"
    assert label.quality == {"small": 0.0, "big": 1.0}
    first, second = (messages[-1]["content"] for messages in judge.shown)
    assert first.index("Italy") < first.index("France") and second.index("France") < second.index("Italy")
    assert "Where is Paris?" in first and judge.shown[0][0]["role"] == "system"


@pytest.mark.parametrize(
    ("replies", "quality", "agreement"),
    [
        (("Verdict: A", "Verdict: A"), {"small": 0.5, "big": 0.5}, "orders disagree"),  # position bias
        (("Verdict: TIE", "verdict: tie"), {"small": 0.5, "big": 0.5}, "orders agree"),
        (("**Verdict: A**", "Verdict: B"), {"small": 1.0, "big": 0.0}, "orders agree"),
    ],
)
async def test_a_judge_that_contradicts_itself_across_orders_makes_a_tie(replies, quality, agreement):
    label = await grade(ask("Write a haiku"), (Answer("small", "x"), Answer("big", "y")), judge=ScriptedJudge(*replies))
    assert label is not None and label.quality == quality and agreement in label.detail


async def test_an_unreadable_verdict_gives_no_label():
    judge = ScriptedJudge("Both have merits.", "Verdict: A")
    assert await grade(ask("Write a haiku"), (Answer("small", "x"), Answer("big", "y")), judge=judge) is None
    assert len(judge.shown) == 1  # the second order is not asked for


async def test_a_multiple_choice_pair_without_a_readable_reference_goes_to_the_judge():
    judge = ScriptedJudge("Verdict: B", "Verdict: A")
    label = await grade(ask(MCQ), (Answer("small", "Mars"), Answer("big", "It is the gas giant.")), judge=judge)
    assert label is not None and label.source == "judge"


async def test_an_unknown_grader_is_refused():
    with pytest.raises(ValueError, match="unknown grader 'vibes'"):
        await grade(ask("x"), (Answer("a", "1"), Answer("b", "2")), kind="vibes")


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("B", "B"),
        ("(C) because", "C"),
        ("The correct answer is D.", "D"),
        ("I pick option A", "A"),
        ("A good question; the answer is C", "C"),
        ("A good question with no letter", None),
        ("answer is based on ...", None),
    ],
)
def test_choice_of(text, choice):
    assert choice_of(text) == choice


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("#### 1,234", "1234"),
        ("The answer is $12.50", "12.5"),
        ("steps 1 2 3\nso 7 left", "7"),
        ("no digits", None),
        ("-4.0", "-4"),
    ],
)
def test_final_number(text, number):
    assert final_number(text) == number


def test_lettered_options_need_at_least_three_letters_with_a_and_b():
    assert has_lettered_options(MCQ)
    assert has_lettered_options("Pick one:\n(A) x\n(B) y\n(C) z")
    assert not has_lettered_options("A. Introduction\nB. Method")


def test_parse_verdict_and_the_conversation_the_judge_reads():
    assert parse_verdict("Verdict: B") == "B" and parse_verdict("tie") == "TIE" and parse_verdict("maybe") is None
    text = render_conversation(
        [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url"}]}]
    )
    assert text == "user: what is this\n[image_url]"
