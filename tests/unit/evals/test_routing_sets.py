"""The shipped routing sets beyond RouteLLM's: LLMRouter's task kinds and arena-bench-v1's graded chat."""

from __future__ import annotations

from collections import Counter

import pytest

from switchyard.evals.datasets import PAIRS, hash_folds, load_arena, load_dataset, load_llmrouter


@pytest.fixture(scope="module")
def llmrouter():
    return load_llmrouter()


@pytest.fixture(scope="module")
def arena():
    return load_arena()


def test_llmrouter_keeps_its_own_split_and_all_nine_models(llmrouter):
    assert Counter(t.split for t in llmrouter) == {"train": 5607, "test": 500}
    weak, strong = PAIRS["llmrouter"]
    assert all(len(t.models) == 9 and weak in t.models and strong in t.models for t in llmrouter)
    assert all(0 <= o.quality <= 1 for t in llmrouter for o in t.models.values())
    assert len({t.id for t in llmrouter}) == len(llmrouter)


def test_arena_quality_is_the_grade_over_ten_and_missing_grades_stay_missing(arena):
    assert len(arena) == 299
    weak, strong = PAIRS["arena"]
    assert sum(weak in t.models and strong in t.models for t in arena) == 292
    first = arena[0]  # graded 10 and 8 in graded.jsonl
    assert first.models[strong].quality == 1.0 and first.models[weak].quality == 0.8
    assert {t.split for t in arena} == {"train", "test"}


def test_hash_folds_hold_out_every_prompt_exactly_once(arena):
    folds = hash_folds(arena, 5)
    held = Counter(t.id for fold in folds for t in fold if t.split == "test")
    assert set(held) == {t.id for t in arena} and set(held.values()) == {1}
    assert [len([t for t in fold if t.split == "test"]) for fold in folds] == [60, 60, 60, 60, 59]
    assert hash_folds(arena, 5)[2][7].split == folds[2][7].split  # deterministic


def test_named_sets_carry_their_pair_and_source():
    _, meta = load_dataset("arena")
    assert (meta["weak_model"], meta["strong_model"]) == PAIRS["arena"]
    assert "Apache-2.0" in meta["source"] and "grade" in meta["note"]
