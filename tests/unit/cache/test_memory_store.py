"""The in-process store: TTL on its clock, least recently used out at max_entries, neighbours
within one (scope, context), purge by scope."""

from __future__ import annotations

import numpy as np
import pytest

from switchyard.cache.entries import CachedAnswer
from switchyard.cache.memory_store import MemoryStore
from tests.fakes.clock import ManualClock


def _answer(text: str) -> CachedAnswer:
    return CachedAnswer(text.encode(), "m", "openai#0", 3, 2, 0.01, 0.0, prompt_text=text)


def _unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


async def test_an_entry_lives_its_ttl_and_the_least_recently_used_goes_first():
    clock = ManualClock()
    store = MemoryStore(2, clock=clock)
    await store.put("t", "a", _answer("a"), 10, context=None, vector=None)
    await store.put("t", "b", _answer("b"), 10, context=None, vector=None)
    assert await store.get("t", "a") is not None  # a is now the most recently used
    await store.put("t", "c", _answer("c"), 10, context=None, vector=None)
    assert await store.get("t", "b") is None and len(store) == 2
    clock.advance(9.9)
    assert await store.get("t", "c") is not None
    clock.advance(0.2)
    assert await store.get("t", "c") is None and await store.get("t", "a") is None


async def test_neighbours_are_searched_within_one_scope_and_context_most_similar_first():
    store = MemoryStore(100)
    await store.put("t", "k1", _answer("one"), 60, context="c", vector=_unit(1, 0, 0))
    await store.put("t", "k2", _answer("two"), 60, context="c", vector=_unit(1, 1, 0))
    await store.put("t", "k3", _answer("three"), 60, context="other", vector=_unit(1, 0, 0))
    await store.put("u", "k4", _answer("four"), 60, context="c", vector=_unit(1, 0, 0))
    found = await store.nearest("t", "c", _unit(1, 0.1, 0), 5)
    assert [c.answer.prompt_text for c in found] == ["one", "two"]
    assert found[0].similarity == pytest.approx(float(_unit(1, 0, 0) @ _unit(1, 0.1, 0)))
    assert [c.answer.prompt_text for c in await store.nearest("t", "c", _unit(0, 1, 0), 1)] == ["two"]
    assert await store.purge("t") == 3
    assert await store.nearest("t", "c", _unit(1, 0, 0), 5) == [] and await store.get("u", "k4") is not None


async def test_a_groups_rows_stay_right_as_entries_come_and_go():
    store = MemoryStore(3)
    vectors = [_unit(1, i, 0) for i in range(6)]
    for i, vector in enumerate(vectors):  # the first three are pushed out in turn
        await store.put("t", f"k{i}", _answer(str(i)), 60, context="c", vector=vector)
    found = await store.nearest("t", "c", vectors[0], 10)
    assert sorted(c.answer.prompt_text for c in found) == ["3", "4", "5"]
    for candidate in found:
        index = int(candidate.answer.prompt_text or "")
        assert candidate.similarity == pytest.approx(float(vectors[index] @ vectors[0]))
