import re

import numpy as np
import pytest

from switchyard.classifier.features import _CODE, FEATURE_NAMES, feature_matrix, prompt_features

CODE = FEATURE_NAMES.index("code_markers")
STEPS = FEATURE_NAMES.index("step_words")


@pytest.mark.parametrize(
    ("text", "markers"),
    [
        ("What is the capital of France?", 0),
        ("```python\ndef f(x):\n    return x => 1;\n```", 6),
        ("int main() {\n#include <stdio.h>\n}", 3),
        ("SELECT * FROM t; -- a function", 2),
        ("A classroom has a surplus; each desk returns nothing", 0),
    ],
)
def test_code_markers_count_what_the_regex_counts(text, markers):
    assert prompt_features(text)[CODE] == markers == len(_CODE.findall(text))


def test_step_words_ignore_case_and_need_whole_words():
    text = "How MANY apples are LEFT in Total? Each person... personal, totally, lefts"
    expected = re.compile(
        r"\b(how many|how much|total|each|per|left|remain|altogether|times|percent|average)\b", re.I
    ).findall(text)
    assert prompt_features(text)[STEPS] == len(expected) == 4


def test_the_matrix_has_one_row_per_prompt():
    assert feature_matrix(["a", "b c"]).shape == (2, len(FEATURE_NAMES))
    assert feature_matrix([]).shape == (0, len(FEATURE_NAMES))
    assert np.isfinite(feature_matrix(["", "?" * 10])).all()
