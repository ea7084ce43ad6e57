"""`ValkeyStore`: the response cache in Valkey (or Redis), shared by every replica that names it.

Keys (a scope's name percent-escaped, so `:` or a glob character in it cannot reach another scope):

    switchyard:cache:index                  sorted set: every entry's key by its expiry (µs), for max_entries
    switchyard:cache:s:{scope}:e:{id}       one entry (`encode_answer`), SET with PX ttl
    switchyard:cache:s:{scope}:v:{context}  a context's vectors: a 16-byte header (nonce, dimension),
                                            then one record per entry put (16-byte id, float32 vector)

`id` and `context` are 16-byte BLAKE2b digests (hex in key names) of the caller's key and context;
the formats are in `valkey_records`.
A put is one script (entry, index, vectors appended, expiry and trim decided at once); the entries
the trim pushes out are deleted by a second command, so `max_entries` may be passed by a few for a
moment under concurrent puts. With one `ttl_s` the entry nearest its expiry is the oldest.

Semantic search (docs/cache.md, "In Valkey", has the measurement that chose it): each replica mirrors the
vectors of the contexts it searched. A lookup is one script that returns the context's header, the
bytes appended since this replica last looked, and the entries its mirror expects to be the
closest; a new nonce (the context was purged, expired or compacted) returns the context whole.
When the bytes appended or expired entries change the order, the closest are fetched with MGET.
Dead records are dropped when a context's record count reaches a power of two and more than half of
them are dead.

When Valkey does not answer, a lookup is a miss and a put is dropped (a WARNING at most every 30 s):
the cache must never fail a request. `purge` raises `ServiceUnavailable`: an admin must know.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, WatchError

from switchyard.cache.entries import CachedAnswer, Candidate
from switchyard.cache.valkey_records import (
    HEADER,
    as_bytes,
    as_vector,
    decode_answer,
    digest,
    encode_answer,
    escape_scope,
    parse_records,
)
from switchyard.cache.vectors import cosines
from switchyard.core.errors import ServiceUnavailable
from switchyard.core.urls import mask_password

log = logging.getLogger(__name__)

T = TypeVar("T")
KEY_PREFIX = "switchyard:cache:"
WARN_EVERY_S = 30.0
COMPACT_FROM = 64  # records in a context before dead ones are looked for
MIRROR_MAX_BYTES = 64 * 1024 * 1024

# KEYS: entry, index[, vectors]. ARGV: answer, ttl_ms, max_entries[, header, record].
# Returns the vectors' length in bytes (0 without) and the index members pushed out by max_entries.
PUT = """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_us)
redis.call('ZADD', KEYS[2], now_us + ttl * 1000, KEYS[1])
local length = 0
if #KEYS == 3 then
  if redis.call('GETRANGE', KEYS[3], 8, 11) == string.sub(ARGV[4], 9, 12) then
    length = redis.call('APPEND', KEYS[3], ARGV[5])
  else
    redis.call('SET', KEYS[3], ARGV[4] .. ARGV[5])
    length = string.len(ARGV[4]) + string.len(ARGV[5])
  end
  if redis.call('PTTL', KEYS[3]) < ttl then
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
end
local pushed = {}
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #popped, 2 do
    pushed[#pushed + 1] = popped[i]
  end
end
return {length, pushed}
"""

# KEYS: a context's vectors, then entries. ARGV: the offset read up to, the nonce read then ("" for none).
# Returns the header, the bytes after the offset (every record when the nonce has changed), the entries.
READ = """
local header = redis.call('GETRANGE', KEYS[1], 0, 15)
local from = ARGV[1]
if string.sub(header, 1, 8) ~= ARGV[2] then
  from = 16
end
local reply = {header, redis.call('GETRANGE', KEYS[1], from, -1)}
for i = 2, #KEYS do
  reply[i + 1] = redis.call('GET', KEYS[i])
end
return reply
"""


def ranked_ids(ids: np.ndarray, similarities: np.ndarray, limit: int) -> Iterator[dict[bytes, float]]:
    """Entry ids by similarity, highest first, each once (an entry put twice has two records), in
    groups of `limit`: a partial sort of the best few first, a full sort only if the caller reads on."""
    seen: set[bytes] = set()
    group: dict[bytes, float] = {}
    for order in _orders(similarities, 4 * limit):
        for i in order:
            entry_id = ids[i].tobytes()
            if entry_id in seen:
                continue
            seen.add(entry_id)
            group[entry_id] = float(similarities[i])
            if len(group) == limit:
                yield group
                group = {}
    if group:
        yield group


def _orders(similarities: np.ndarray, window: int) -> Iterator[np.ndarray]:
    if len(similarities) > window:
        top = np.argpartition(-similarities, window)[:window]
        yield top[np.argsort(-similarities[top], kind="stable")]
    yield np.argsort(-similarities, kind="stable")


class ContextMirror:
    """What this replica knows of one context's vectors: the records read so far, in buffers that
    grow by doubling (a lookup after every put would otherwise copy the whole matrix each time)."""

    def __init__(self, nonce: bytes, dimension: int, data: bytes) -> None:
        self.nonce = nonce
        self.dimension = dimension
        self.num_bytes = HEADER.size + len(data)  # of the value in Valkey
        self._ids, self._vectors = parse_records(data, dimension)
        self._count = len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        return self._ids[: self._count]

    @property
    def vectors(self) -> np.ndarray:
        return self._vectors[: self._count]

    @property
    def size_bytes(self) -> int:
        return self._ids.nbytes + self._vectors.nbytes

    def append(self, data: bytes) -> None:
        ids, vectors = parse_records(data, self.dimension)
        needed = self._count + len(ids)
        if needed > len(self._ids):
            capacity = max(needed, 2 * len(self._ids), 16)
            grown_ids = np.empty((capacity, self._ids.shape[1]), dtype=self._ids.dtype)
            grown_vectors = np.empty((capacity, self.dimension), dtype=self._vectors.dtype)
            grown_ids[: self._count] = self.ids
            grown_vectors[: self._count] = self.vectors
            self._ids, self._vectors = grown_ids, grown_vectors
        self._ids[self._count : needed] = ids
        self._vectors[self._count : needed] = vectors
        self._count = needed
        self.num_bytes += len(data)


class ValkeyStore:
    """A `CacheStore` in Valkey. `mirror=False` reads a context's vectors whole on every lookup
    (the slower option the benchmark compares against)."""

    def __init__(
        self,
        url: str,
        *,
        max_entries: int,
        timeout_s: float = 1.0,
        max_connections: int = 32,
        mirror: bool = True,
        key_prefix: str = KEY_PREFIX,
    ) -> None:
        self.display_url = mask_password(url)
        self.max_entries = max_entries
        self._prefix = key_prefix
        self._index = f"{key_prefix}index"
        self._pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout_s,  # a burst waits this long for a connection, then misses
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
        self._client = aioredis.Redis(connection_pool=self._pool)
        self._put = self._client.register_script(PUT)
        self._read = self._client.register_script(READ)
        self._use_mirror = mirror
        self._mirrors: OrderedDict[str, ContextMirror] = OrderedDict()
        self._mirror_bytes = 0
        self._last_warning_at = float("-inf")

    def _scope_prefix(self, scope: str) -> str:
        return f"{self._prefix}s:{escape_scope(scope)}:"

    def _entry_key(self, scope: str, entry_id: bytes) -> str:
        return f"{self._scope_prefix(scope)}e:{entry_id.hex()}"

    def _vectors_key(self, scope: str, context: str) -> str:
        return f"{self._scope_prefix(scope)}v:{digest(context).hex()}"

    async def get(self, scope: str, key: str) -> CachedAnswer | None:
        data = await self._quietly(lambda: self._client.get(self._entry_key(scope, digest(key))), None)
        return decode_answer(data)

    async def nearest(self, scope: str, context: str, vector: np.ndarray, limit: int) -> list[Candidate]:
        if limit <= 0:
            return []
        query = as_vector(vector)
        return await self._quietly(lambda: self._nearest(scope, context, query, limit), [])

    async def put(
        self,
        scope: str,
        key: str,
        answer: CachedAnswer,
        ttl_s: float,
        *,
        context: str | None,
        vector: np.ndarray | None,
    ) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        entry_id = digest(key)
        keys = [self._entry_key(scope, entry_id), self._index]
        args: list[bytes | int] = [encode_answer(answer), ttl_ms, self.max_entries]
        record = b""
        if context is not None and vector is not None:
            values = as_vector(vector)
            keys.append(self._vectors_key(scope, context))
            record = entry_id + values.tobytes()
            args += [HEADER.pack(os.urandom(8), values.size), record]
        reply = await self._quietly(lambda: self._put(keys, args), None)
        if reply is None:
            return
        num_bytes, pushed = reply
        if pushed:
            await self._quietly(lambda: self._client.delete(*pushed), None)
        if record:
            num_records = (int(num_bytes) - HEADER.size) // len(record)
            if num_records >= COMPACT_FROM and num_records & (num_records - 1) == 0:
                await self._quietly(lambda: self._compact(scope, keys[2]), None)

    async def purge(self, scope: str) -> int:
        try:
            return await self._purge(scope)
        except (RedisError, OSError) as exc:
            raise ServiceUnavailable(
                f"The response cache's Valkey/Redis at {self.display_url} did not answer "
                f"({type(exc).__name__}: {exc}); nothing was purged for certain."
            ) from exc

    async def close(self) -> None:
        await self._client.aclose()
        await self._pool.aclose()

    async def _nearest(self, scope: str, context: str, query: np.ndarray, limit: int) -> list[Candidate]:
        vectors_key = self._vectors_key(scope, context)
        known = self._mirrors.get(vectors_key) if self._use_mirror else None
        start, nonce = (known.num_bytes, known.nonce) if known is not None else (HEADER.size, b"")
        similarities = None
        guessed: list[bytes] = []
        if known is not None and known.vectors.shape[1] == query.size:
            similarities = cosines(known.vectors, query)
            guessed = list(next(ranked_ids(known.ids, similarities, limit), {}))
        # One round trip: what was appended since, and the answers the mirror expects to be the best.
        header, data, *values = await self._read(
            keys=[vectors_key, *(self._entry_key(scope, entry_id) for entry_id in guessed)], args=[start, nonce]
        )
        mirror = self._take_in(vectors_key, known, start, header, data)
        if mirror is None or not len(mirror.ids) or mirror.vectors.shape[1] != query.size:
            return []
        if similarities is None or mirror is not known:
            similarities = cosines(mirror.vectors, query)
        elif len(similarities) < len(mirror.ids):  # records appended since: only theirs to compute
            similarities = np.concatenate((similarities, cosines(mirror.vectors[len(similarities) :], query)))
        fetched: dict[bytes, bytes | str | None] = dict(zip(guessed, values, strict=True))
        found: list[Candidate] = []
        for ids in ranked_ids(mirror.ids, similarities, limit):
            # Entries that expired or were pushed out make it look further down.
            missing = [entry_id for entry_id in ids if entry_id not in fetched]
            if missing:
                values = await self._client.mget([self._entry_key(scope, entry_id) for entry_id in missing])
                fetched.update(zip(missing, values, strict=True))
            for entry_id, similarity in ids.items():
                answer = decode_answer(fetched[entry_id])
                if answer is not None:
                    found.append(Candidate(similarity=similarity, answer=answer))
            if len(found) >= limit:
                break
        return found[:limit]

    def _take_in(
        self, vectors_key: str, known: ContextMirror | None, start: int, header: bytes, data: bytes
    ) -> ContextMirror | None:
        """The context's vectors after a read from `start`: the mirror grown by what was appended, or
        (new nonce, or no mirror) what was read."""
        if len(header) < HEADER.size:
            self._forget(vectors_key)
            return None
        nonce, dimension = HEADER.unpack(header)
        if known is not None and known.nonce == nonce:
            if data and known.num_bytes == start:  # else a concurrent lookup has added these bytes
                before = known.size_bytes
                known.append(data)
                self._mirror_bytes += known.size_bytes - before
            self._mirrors.move_to_end(vectors_key)
            return known
        mirror = ContextMirror(nonce, dimension, data)
        if self._use_mirror:
            self._remember(vectors_key, mirror)
        return mirror

    def _remember(self, vectors_key: str, mirror: ContextMirror) -> None:
        self._forget(vectors_key)
        self._mirrors[vectors_key] = mirror
        self._mirror_bytes += mirror.size_bytes
        while self._mirror_bytes > MIRROR_MAX_BYTES and len(self._mirrors) > 1:
            _, oldest = self._mirrors.popitem(last=False)
            self._mirror_bytes -= oldest.size_bytes

    def _forget(self, vectors_key: str) -> None:
        gone = self._mirrors.pop(vectors_key, None)
        if gone is not None:
            self._mirror_bytes -= gone.size_bytes

    async def _compact(self, scope: str, vectors_key: str) -> None:
        """Rewrite a context's vectors without the dead records, if over half are dead; a put by
        another replica meanwhile (WATCH) leaves it for the next time."""
        async with self._client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(vectors_key)
                data = as_bytes(await pipe.get(vectors_key))
                ttl_ms = await pipe.pttl(vectors_key)
                if len(data) < HEADER.size or ttl_ms <= 0:
                    return
                _, dimension = HEADER.unpack_from(data)
                ids, vectors = parse_records(data[HEADER.size :], dimension)
                unique = list(dict.fromkeys(row.tobytes() for row in ids))
                entry_keys = [self._entry_key(scope, entry_id) for entry_id in unique]
                if await pipe.exists(*entry_keys) * 2 > len(ids):
                    return
                async with self._client.pipeline(transaction=False) as check:
                    for entry_key in entry_keys:
                        check.exists(entry_key)
                    alive = await check.execute()
                keep = {entry_id for entry_id, is_alive in zip(unique, alive, strict=True) if is_alive}
                kept = bytearray()
                for i in range(len(ids)):
                    entry_id = ids[i].tobytes()
                    if entry_id in keep:
                        keep.remove(entry_id)
                        kept += entry_id + vectors[i].tobytes()
                pipe.multi()
                pipe.set(vectors_key, HEADER.pack(os.urandom(8), dimension) + bytes(kept), px=ttl_ms)
                await pipe.execute()
            except WatchError:
                return

    async def _purge(self, scope: str) -> int:
        num_entries = 0
        entry_marker = f"{self._scope_prefix(scope)}e:".encode()
        batch: list[bytes] = []
        async for key in self._client.scan_iter(match=f"{self._scope_prefix(scope)}*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                num_entries += await self._drop(batch, entry_marker)
                batch = []
        if batch:
            num_entries += await self._drop(batch, entry_marker)
        for vectors_key in [k for k in self._mirrors if k.startswith(self._scope_prefix(scope))]:
            self._forget(vectors_key)
        return num_entries

    async def _drop(self, keys: list[bytes], entry_marker: bytes) -> int:
        """Delete `keys`; how many of them were entries (one that expired meanwhile is not counted)."""
        entries = [key for key in keys if key.startswith(entry_marker)]
        others = [key for key in keys if not key.startswith(entry_marker)]
        num_deleted = 0
        async with self._client.pipeline(transaction=False) as pipe:
            if entries:
                pipe.delete(*entries)
                pipe.zrem(self._index, *entries)
            if others:
                pipe.delete(*others)
            replies = await pipe.execute()
        if entries:
            num_deleted = int(replies[0])
        return num_deleted

    async def _quietly(self, call: Callable[[], Awaitable[T]], fallback: T) -> T:
        """`call()`, or `fallback` when Valkey does not answer: the cache never fails a request."""
        try:
            return await call()
        except (RedisError, OSError) as exc:
            now = time.monotonic()
            if now - self._last_warning_at >= WARN_EVERY_S:
                self._last_warning_at = now
                log.warning(
                    "response cache: Valkey/Redis at %s did not answer (%s: %s); serving without the cache",
                    self.display_url,
                    type(exc).__name__,
                    exc,
                )
            return fallback
