import pytest

from switchyard.evals.grading import final_number, grade, guess_grader, mmlu_letter


@pytest.mark.parametrize(
    ("answer", "letter"),
    [("B", "B"), (" (c) because", "C"), ("The answer is D.", "D"), ("I think A is right", "A"), ("none", None)],
)
def test_mmlu_letters(answer, letter):
    assert mmlu_letter(answer) == letter


def test_final_numbers():
    assert final_number("She makes 9 * 2 = $18.") == 18
    assert final_number("a total of 1,200 eggs") == 1200
    assert final_number("-3.5 degrees") == -3.5
    assert final_number("no digits") is None


def test_grading_and_guessing():
    assert grade("gsm8k", "so the answer is 18", "18") == 1.0
    assert grade("gsm8k", "18 then 19", "18") == 0.0
    assert grade("mmlu", "Answer: b", "B") == 1.0
    assert grade("exact", "It is  Paris, France", "paris") == 1.0
    assert (guess_grader("C"), guess_grader("1,024"), guess_grader("Paris")) == ("mmlu", "gsm8k", "exact")
    with pytest.raises(ValueError, match="unknown grader"):
        grade("vibes", "a", "b")
