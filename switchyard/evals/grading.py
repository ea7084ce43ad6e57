"""Grading answers against references: a multiple-choice letter, a final number, or a string."""

from __future__ import annotations

import re

GRADERS = ("mmlu", "gsm8k", "exact")

_LETTER = re.compile(r"(?:answer\s*(?:is|:)?\s*\(?|^\s*\(?)([A-D])\b", re.IGNORECASE | re.MULTILINE)
_ANY_LETTER = re.compile(r"\b([A-D])\b")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def mmlu_letter(answer: str) -> str | None:
    """The letter an answer picks: after 'answer is', or leading the answer, else the first lone A-D."""
    match = _LETTER.search(answer) or _ANY_LETTER.search(answer)
    return match.group(1).upper() if match else None


def final_number(text: str) -> float | None:
    """The last number in a text (GSM8K answers end with it), commas and a trailing dot ignored."""
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def guess_grader(reference: str) -> str:
    reference = reference.strip()
    if re.fullmatch(r"[A-Da-d]", reference):
        return "mmlu"
    if final_number(reference) is not None and re.fullmatch(r"-?[\d,]+(\.\d+)?", reference):
        return "gsm8k"
    return "exact"


def grade(grader: str, answer: str, reference: str) -> float:
    """1.0 if the answer is right, else 0.0."""
    if grader == "mmlu":
        return float(mmlu_letter(answer) == reference.strip().upper())
    if grader == "gsm8k":
        got, want = final_number(answer), final_number(reference)
        return float(got is not None and want is not None and abs(got - want) < 1e-6)
    if grader == "exact":
        return float(" ".join(reference.lower().split()) in " ".join(answer.lower().split()))
    raise ValueError(f"unknown grader {grader!r}; known: {', '.join(GRADERS)}")
