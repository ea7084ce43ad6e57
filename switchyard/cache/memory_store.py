"""The in-process store: entries in this process's memory, the least recently used out first at
`max_entries`, each gone after its TTL; semantic neighbours searched with one matrix product per
(scope, context) group. Every operation is well under a millisecond, so it runs on the event loop."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from switchyard.cache.entries import CachedAnswer, Candidate
from switchyard.cache.vectors import cosines

_GROUP_START = 8  # rows a group's matrix starts with; doubled as it fills


@dataclass(slots=True)
class _Entry:
    answer: CachedAnswer
    expires_at: float
    context: str | None


class _Group:
    """The vectors of one (scope, context): row i is `keys[i]`'s."""

    __slots__ = ("keys", "rows", "matrix")

    def __init__(self, dim: int) -> None:
        self.keys: list[str] = []
        self.rows: dict[str, int] = {}
        self.matrix = np.zeros((_GROUP_START, dim), dtype=np.float32)

    def add(self, key: str, vector: np.ndarray) -> None:
        row = self.rows.get(key)
        if row is None:
            row = len(self.keys)
            if row == len(self.matrix):
                self.matrix = np.concatenate([self.matrix, np.zeros_like(self.matrix)])
            self.keys.append(key)
            self.rows[key] = row
        self.matrix[row] = vector

    def remove(self, key: str) -> None:
        row = self.rows.pop(key, None)
        if row is None:
            return
        last = len(self.keys) - 1
        if row != last:  # the last row moves into the hole
            moved = self.keys[last]
            self.keys[row], self.matrix[row] = moved, self.matrix[last]
            self.rows[moved] = row
        self.keys.pop()

    def nearest(self, vector: np.ndarray, limit: int) -> list[tuple[str, float]]:
        size = len(self.keys)
        if not size or vector.shape != self.matrix.shape[1:]:  # a vector of another embedder matches nothing
            return []
        similarities = cosines(self.matrix[:size], vector)
        if size > limit:
            top = np.argpartition(-similarities, limit - 1)[:limit]
        else:
            top = np.arange(size)
        top = top[np.argsort(-similarities[top])]
        return [(self.keys[i], float(similarities[i])) for i in top]


class MemoryStore:
    """A `CacheStore` in this process. `clock` (unix seconds) decides expiry: tests move it."""

    def __init__(self, max_entries: int, *, clock: Callable[[], float] = time.time) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._groups: dict[tuple[str, str], _Group] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, scope: str, key: str) -> _Entry | None:
        entry = self._entries.get((scope, key))
        if entry is None:
            return None
        if entry.expires_at <= self.clock():
            self._drop(scope, key)
            return None
        self._entries.move_to_end((scope, key))
        return entry

    def _drop(self, scope: str, key: str) -> None:
        entry = self._entries.pop((scope, key), None)
        if entry is None or entry.context is None:
            return
        group = self._groups.get((scope, entry.context))
        if group is not None:
            group.remove(key)
            if not group.keys:
                del self._groups[(scope, entry.context)]

    async def get(self, scope: str, key: str) -> CachedAnswer | None:
        entry = self._live(scope, key)
        return entry.answer if entry is not None else None

    async def nearest(self, scope: str, context: str, vector: np.ndarray, limit: int) -> list[Candidate]:
        group = self._groups.get((scope, context))
        if group is None:
            return []
        found: list[Candidate] = []
        for key, similarity in group.nearest(vector, limit):
            entry = self._live(scope, key)
            if entry is not None:
                found.append(Candidate(similarity, entry.answer))
        return found

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
        self._drop(scope, key)
        stored_context = context if vector is not None else None
        self._entries[(scope, key)] = _Entry(answer, self.clock() + ttl_s, stored_context)
        if stored_context is not None and vector is not None:
            group = self._groups.get((scope, stored_context))
            if group is None:
                group = self._groups[(scope, stored_context)] = _Group(len(vector))
            group.add(key, np.asarray(vector, dtype=np.float32))
        while len(self._entries) > self.max_entries:
            (old_scope, old_key), _ = next(iter(self._entries.items()))
            self._drop(old_scope, old_key)

    async def purge(self, scope: str) -> int:
        keys = [key for (entry_scope, key) in self._entries if entry_scope == scope]
        for key in keys:
            self._drop(scope, key)
        return len(keys)

    async def close(self) -> None:
        self._entries.clear()
        self._groups.clear()
