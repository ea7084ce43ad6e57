"""Who answered a request, and what: the one result type from a backend's answer to the client.

The resilience layer returns it (a whole answer, or a stream whose first chunk has arrived), the
cascade hands on the rung's that it sends (saying what it did, `cascade`), and the gateway's relay
keeps it in its `Relayed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from switchyard.backends.registry import ModelEntry
from switchyard.core.chat_wire import CompletionResult, StreamChunk
from switchyard.core.errors import Attempt


@dataclass(frozen=True, slots=True)
class Answered:
    """The model that answered (the one asked for, or a fallback) and the deployment (`openai#1`,
    never its address), with a whole answer (`result`) or a stream (`first`, None when it ended
    empty, then `rest`; from here on only in-band errors remain, and its breaker tickets are
    settled when `rest` ends)."""

    entry: ModelEntry
    deployment: str
    result: CompletionResult | None = None
    first: StreamChunk | None = None
    rest: AsyncIterator[StreamChunk] | None = None
    # chunks a whole answer was assembled from (0: asked whole): whoever meters it estimates its
    # tokens from them when the upstream sent no usage
    num_chunks: int = 0
    failures: tuple[Attempt, ...] = ()  # the attempts that failed before it, in order
    cascade: str | None = None  # what the cascade did (`x-switchyard-cascade`), when it answered

    @property
    def whole(self) -> CompletionResult:
        """The whole answer (of a request that did not stream)."""
        assert self.result is not None, "a stream has no whole answer"
        return self.result

    @property
    def chunks(self) -> AsyncIterator[StreamChunk]:
        """A stream's chunks after the first."""
        assert self.rest is not None, "a whole answer has no stream"
        return self.rest
