"""Cheap features of a prompt that an embedding of its meaning can miss: size, code, maths, form."""

from __future__ import annotations

import math
import re

import numpy as np

_CODE = re.compile(r"```|\bdef |\bclass |\breturn\b|[{};]\s*$|#include|=>|\bfunction\b|\bSELECT\b", re.MULTILINE)
_MATH = re.compile(r"[=+\-*/^%<>]|\\frac|\\sqrt|\$|\d+(?:\.\d+)?")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_CHOICE = re.compile(r"^[A-D]\.\s", re.MULTILINE)
_SENTENCE = re.compile(r"[.!?](?:\s|$)")
# Matched against the lower-cased text: half the cost of re.I, the same counts on every prompt of the evals.
_STEP_WORDS = re.compile(r"\b(?:how many|how much|total|each|per|left|remain|altogether|times|percent|average)\b")
# Each _CODE alternative contains one of these; most prompts contain none, and skip the regex (5x cheaper).
_CODE_LITERALS = ("```", "def ", "class ", "return", "{", "}", ";", "#include", "=>", "function", "SELECT")

FEATURE_NAMES = (
    "log_chars",
    "log_words",
    "num_sentences",
    "num_questions",
    "num_numbers",
    "math_density",
    "code_markers",
    "multiple_choice",
    "step_words",
    "long_words_share",
)


def prompt_features(text: str) -> list[float]:
    words = text.split()
    num_words = max(1, len(words))
    return [
        math.log1p(len(text)),
        math.log1p(len(words)),
        float(len(_SENTENCE.findall(text))),
        float(text.count("?")),
        float(len(_NUMBER.findall(text))),
        len(_MATH.findall(text)) / num_words,
        float(len(_CODE.findall(text)) if any(literal in text for literal in _CODE_LITERALS) else 0),
        float(len(_CHOICE.findall(text)) >= 2),
        float(len(_STEP_WORDS.findall(text.lower()))),
        sum(len(w) > 8 for w in words) / num_words,
    ]


def feature_matrix(texts: list[str]) -> np.ndarray:
    return np.array([prompt_features(t) for t in texts], dtype=np.float32).reshape(len(texts), len(FEATURE_NAMES))
