"""What is Valkey's own in `ValkeyStore`: its keys, the replicas' mirrors of a context's vectors, the
compaction of dead vectors, and a Valkey that goes away (stopped or hung, for real).

The promises every store keeps are in test_store_conformance.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest

from switchyard.cache.valkey_records import HEADER
from switchyard.cache.valkey_store import COMPACT_FROM, ValkeyStore
from switchyard.core.errors import ServiceUnavailable
from tests.integration.cache.stores import DIMENSION, LONG_TTL_S, answer, basis, toward, unit
from tests.servers.valkey import EmbeddedValkey, valkey_fixture, valkey_session_fixture  # noqa: F401

RECORD_BYTES = 16 + 4 * DIMENSION


@pytest.fixture
async def make_store(valkey: EmbeddedValkey) -> AsyncIterator[Callable[..., ValkeyStore]]:
    made: list[ValkeyStore] = []

    def make(**options) -> ValkeyStore:
        store = ValkeyStore(valkey.url, **({"max_entries": 1000, "timeout_s": 30.0} | options))
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


def keys(valkey: EmbeddedValkey, pattern: str = "*") -> list[str]:
    with valkey.client() as client:
        return sorted(client.scan_iter(match=pattern))


async def test_keys_live_under_the_cache_prefix_with_the_scope_escaped(make_store, valkey) -> None:
    store = make_store()
    await store.put("sup:port*", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    found = keys(valkey)
    assert found[0] == "switchyard:cache:index"
    assert {key.rsplit(":", 1)[0] for key in found[1:]} == {
        "switchyard:cache:s:sup%3Aport%2A:e",
        "switchyard:cache:s:sup%3Aport%2A:v",
    }


async def test_purge_leaves_the_batch_queue_and_other_keys_alone(make_store, valkey) -> None:
    store = make_store()
    with valkey.client() as client:
        client.xadd("switchyard:batch:work", {"line": "1"})
        client.set("switchyard:budget:team:x", "1")
    await store.put("switchyard", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    await store.put("*", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert await store.purge("switchyard") == 1
    assert await store.purge("*") == 1
    assert keys(valkey) == ["switchyard:batch:work", "switchyard:budget:team:x"]


async def test_entries_pushed_out_by_max_entries_are_deleted(make_store, valkey) -> None:
    store = make_store(max_entries=3)
    for i in range(6):
        await store.put("support", f"k{i}", answer(str(i)), LONG_TTL_S, context=None, vector=None)
    assert len(keys(valkey, "switchyard:cache:s:support:e:*")) == 3
    with valkey.client() as client:
        assert client.zcard("switchyard:cache:index") == 3


async def test_a_replicas_mirror_takes_in_what_another_replica_puts(make_store) -> None:
    first, second = make_store(), make_store()
    await first.put("support", "k0", answer("zero"), LONG_TTL_S, context="ctx", vector=toward(0.5))
    assert [c.answer.body for c in await second.nearest("support", "ctx", basis(0), 5)] == [answer("zero").body]
    await first.put("support", "k1", answer("one"), LONG_TTL_S, context="ctx", vector=toward(0.9))
    near = await second.nearest("support", "ctx", basis(0), 5)
    assert [c.answer.body for c in near] == [answer("one").body, answer("zero").body]


async def test_a_mirror_is_read_again_after_a_purge_and_a_refill_of_the_same_size(make_store) -> None:
    first, second = make_store(), make_store()
    for i in range(3):
        await first.put("support", f"k{i}", answer(f"old{i}"), LONG_TTL_S, context="ctx", vector=toward(0.5, 0, i + 1))
    assert len(await second.nearest("support", "ctx", basis(0), 5)) == 3
    assert await first.purge("support") == 3
    for i in range(4):  # as many bytes or more than the mirror holds: only the new nonce tells
        await first.put("support", f"n{i}", answer(f"new{i}"), LONG_TTL_S, context="ctx", vector=toward(0.6, 0, i + 1))
    near = await second.nearest("support", "ctx", basis(0), 10)
    assert sorted(c.answer.body for c in near) == sorted(answer(f"new{i}").body for i in range(4))


async def test_an_entry_put_twice_is_one_neighbour(make_store) -> None:
    store = make_store()
    await store.put("support", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    await store.put("support", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert len(await store.nearest("support", "ctx", basis(0), 5)) == 1


async def test_dead_vectors_are_compacted_away(make_store, valkey) -> None:
    store, other_replica = make_store(), make_store()
    await store.put("support", "keep", answer("keep"), LONG_TTL_S, context="ctx", vector=basis(0))
    for i in range(COMPACT_FROM - 2):
        await store.put("support", f"short{i}", answer("short"), 0.05, context="ctx", vector=toward(0.5, 0, i + 1))
    assert len(await other_replica.nearest("support", "ctx", basis(0), 100)) >= 1  # it mirrors the context now
    with valkey.client() as client:
        for _ in range(1000):  # Valkey expires them: bounded, ends when they are gone
            if len(keys(valkey, "switchyard:cache:s:support:e:*")) == 1:
                break
            await asyncio.sleep(0.01)
        assert len(keys(valkey, "switchyard:cache:s:support:e:*")) == 1
        (vectors_key,) = keys(valkey, "switchyard:cache:s:support:v:*")
        await store.put("support", "last", answer("last"), LONG_TTL_S, context="ctx", vector=toward(0.9))
        assert client.strlen(vectors_key) == HEADER.size + 2 * RECORD_BYTES
    near = await other_replica.nearest("support", "ctx", basis(0), 100)
    assert [c.answer.body for c in near] == [answer("keep").body, answer("last").body]


async def test_an_entry_in_another_format_is_a_miss(make_store, valkey) -> None:
    store = make_store()
    await store.put("support", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    (entry_key,) = keys(valkey, "switchyard:cache:s:support:e:*")
    with valkey.client() as client:
        client.set(entry_key, b"\x09not this version")
    assert await store.get("support", "k") is None
    assert await store.nearest("support", "ctx", basis(0), 5) == []


async def test_a_stopped_valkey_is_a_miss_a_dropped_put_and_a_purge_that_says_so(make_store, valkey, caplog) -> None:
    store = make_store()
    await store.put("support", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))
    assert len(await store.nearest("support", "ctx", basis(0), 5)) == 1
    with valkey.stopped(), caplog.at_level(logging.WARNING, logger="switchyard.cache.valkey_store"):
        assert await store.get("support", "k") is None
        assert await store.nearest("support", "ctx", basis(0), 5) == []
        await store.put("support", "k2", answer("b"), LONG_TTL_S, context="ctx", vector=basis(1))
        with pytest.raises(ServiceUnavailable, match="did not answer"):
            await store.purge("support")
    assert [r.message for r in caplog.records if "serving without the cache" in r.message]
    await store.put("support", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0))  # back, empty
    assert await store.get("support", "k") is not None
    assert [c.answer.body for c in await store.nearest("support", "ctx", basis(0), 5)] == [answer("a").body]


@pytest.mark.parametrize("call", ["get", "nearest", "put"])
async def test_cancelling_a_call_on_a_hung_valkey_cancels_it(make_store, valkey, call: str) -> None:
    store = make_store()
    await store.get("support", "warm")  # a connection in the pool, which the hung server will not answer
    calls = {
        "get": lambda: store.get("support", "k"),
        "nearest": lambda: store.nearest("support", "ctx", basis(0), 5),
        "put": lambda: store.put("support", "k", answer("a"), LONG_TTL_S, context="ctx", vector=basis(0)),
    }
    with valkey.paused():
        task = asyncio.create_task(calls[call]())
        for _ in range(100):  # the loop runs it up to the read that the hung server never answers
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_when_the_best_neighbour_the_mirror_expects_has_expired_the_next_one_answers(make_store, valkey) -> None:
    store = make_store()
    await store.put("support", "best", answer("best"), LONG_TTL_S, context="ctx", vector=toward(0.99))
    await store.put("support", "next", answer("next"), LONG_TTL_S, context="ctx", vector=toward(0.9))
    assert [c.answer.body for c in await store.nearest("support", "ctx", basis(0), 1)] == [answer("best").body]
    await store.put("support", "best", answer("best"), 0.05, context="ctx", vector=toward(0.99))
    for _ in range(1000):  # Valkey expires it: bounded, ends when it is gone
        if await store.get("support", "best") is None:
            break
        await asyncio.sleep(0.01)
    near = await store.nearest("support", "ctx", basis(0), 1)
    assert [(c.answer.body, round(c.similarity, 4)) for c in near] == [(answer("next").body, 0.9)]


async def test_a_mirror_grown_one_put_at_a_time_ranks_as_a_fresh_read(make_store) -> None:
    writer, follower = make_store(), make_store()
    rng = np.random.default_rng(43)
    query = unit(rng.standard_normal(DIMENSION))
    for i in range(40):  # past the mirror's first buffers, which double as it grows
        vector = unit(rng.standard_normal(DIMENSION))
        await writer.put("support", f"k{i}", answer(f"a{i}"), LONG_TTL_S, context="ctx", vector=vector)
        assert len(await follower.nearest("support", "ctx", query, 1)) == 1
    grown = await follower.nearest("support", "ctx", query, 40)
    fresh = await make_store().nearest("support", "ctx", query, 40)
    assert len(grown) == 40
    assert [(c.answer.body, c.similarity) for c in grown] == [(c.answer.body, c.similarity) for c in fresh]
