"""The classifier's training rows: each dataset's split, read with its own weak/strong pair."""

from __future__ import annotations

from switchyard.core.traces import ModelOutcome, Trace
from switchyard.evals.classifier_train import with_pairs
from switchyard.evals.cli_support import dataset_label


def _trace(i: int, split: str, *models: str) -> Trace:
    return Trace(str(i), f"p{i}", "unit", split, {m: ModelOutcome(1.0, 0.001, 1) for m in models})


def test_each_dataset_keeps_its_split_and_the_traces_graded_for_its_own_pair():
    datasets = {
        "one": [_trace(0, "train", "a", "b"), _trace(1, "test", "a", "b"), _trace(2, "train", "a")],
        "two": [_trace(3, "train", "c", "d", "a"), _trace(4, "train", "a", "b")],
    }
    pairs = {"one": ("a", "b"), "two": ("c", "d")}
    assert {name: [t.id for t in ts] for name, ts in with_pairs(datasets, pairs, "train").items()} == {
        "one": ["0"],
        "two": ["3"],
    }
    assert [t.id for t in with_pairs(datasets, pairs, "test")["one"]] == ["1"]


def test_a_dataset_is_shown_by_its_file_name_or_its_set_name(tmp_path):
    path = tmp_path / "own.jsonl"
    path.write_text("")
    assert dataset_label(str(path)) == "own.jsonl"
    assert dataset_label("gsm8k") == "gsm8k"
