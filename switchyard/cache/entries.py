"""What the response cache keeps, and the interface every store (in-process, Valkey) implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """One answer as it was first given: the chat completion's JSON (whole, also for a request that
    was streamed: a hit is replayed as a stream from it), who answered, and what it cost."""

    body: bytes  # the chat.completion JSON the upstream gave (the model's own wire shape)
    model: str  # the configured model (entry) that answered
    deployment: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float  # what answering cost: what a hit saves
    created_at: float  # time.time() when stored
    prompt_text: str | None = None  # semantic entries: the last user turn, for the guard


@dataclass(frozen=True, slots=True)
class Candidate:
    """A semantic neighbour: an entry in the same context and its cosine similarity to the asked turn."""

    similarity: float
    answer: CachedAnswer


class CacheStore(Protocol):
    """Where entries live. `scope` is the team's name (or the shared scope); `key` the exact key of
    the whole normalised request; `context` the exact key of everything but the last user turn
    (semantic neighbours are searched only within one scope and context); vectors are L2-normalised
    float32. Entries expire after `ttl_s`; a store holds at most its `max_entries`, oldest out first."""

    async def get(self, scope: str, key: str) -> CachedAnswer | None: ...

    async def nearest(self, scope: str, context: str, vector: np.ndarray, limit: int) -> list[Candidate]:
        """The closest live entries of (scope, context), most similar first, at most `limit`."""
        ...

    async def put(
        self,
        scope: str,
        key: str,
        answer: CachedAnswer,
        ttl_s: float,
        *,
        context: str | None,
        vector: np.ndarray | None,
    ) -> None: ...

    async def purge(self, scope: str) -> int:
        """Drop every entry of `scope`; how many there were."""
        ...

    async def close(self) -> None: ...
