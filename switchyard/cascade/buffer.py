"""A judged stream held back until the cascade's verdict, then replayed to the client or dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from switchyard.cascade import logprobs
from switchyard.core.chat_wire import StreamChunk


async def cancel_and_wait(*futures: asyncio.Future) -> None:
    """Cancel child work and wait for it to finish; their outcomes are dropped, but a cancellation
    of the task that waits still propagates (gather is cancelled with it)."""
    for future in futures:
        future.cancel()
    if futures:
        await asyncio.gather(*futures, return_exceptions=True)


class Buffered:
    """A judged stream: chunks held back until the verdict, then replayed or dropped."""

    def __init__(self, first: StreamChunk | None, rest: AsyncIterator[StreamChunk]) -> None:
        self.chunks: list[StreamChunk] = []
        self.evidence = logprobs.EvidenceBuffer()
        self.rest = rest
        self.pending: asyncio.Future | None = None
        self.is_ended = False
        self.usage: dict | None = None
        if first is None:
            self.is_ended = True
        else:
            self._add(first)

    def _add(self, chunk: StreamChunk) -> None:
        self.chunks.append(chunk)
        self.evidence.add(chunk)
        if chunk.has_usage:
            self.usage = chunk.parsed["usage"]

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return self.evidence.num_tokens or len(self.chunks)

    async def fill(self, max_tokens: int, budget_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        while not self.is_ended and not self.evidence.is_finished and self.evidence.num_tokens < max_tokens:
            if self.pending is None:
                self.pending = asyncio.ensure_future(anext(self.rest, None))
            timeout = max(0.0, deadline - loop.time()) if self.evidence.num_tokens else None
            done, _ = await asyncio.wait({self.pending}, timeout=timeout)
            if not done:
                return  # over budget: judge what is here; the pending read carries on
            chunk, self.pending = self.pending.result(), None
            if chunk is None:
                self.is_ended = True
            else:
                self._add(chunk)

    def replay(
        self, for_client: Callable[[StreamChunk], StreamChunk]
    ) -> tuple[StreamChunk | None, AsyncIterator[StreamChunk]]:
        chunks = [for_client(c) for c in self.chunks]
        return (chunks[0] if chunks else None), Replay(self, chunks[1:], for_client)

    async def aclose(self) -> None:
        if self.pending is not None:
            await cancel_and_wait(self.pending)
            self.pending = None
        await self.rest.aclose()  # type: ignore[attr-defined]


class Replay:
    """The held-back chunks, then the read that was pending at the verdict, then the rest.

    A class, not an async generator, so that `aclose()` closes the upstream even if the client
    never read a byte (an unstarted generator's `finally` never runs).
    """

    def __init__(
        self, buffered: Buffered, held: list[StreamChunk], for_client: Callable[[StreamChunk], StreamChunk]
    ) -> None:
        self.buffered, self.held, self.for_client = buffered, list(held), for_client

    def __aiter__(self) -> Replay:
        return self

    async def __anext__(self) -> StreamChunk:
        if self.held:
            return self.held.pop(0)
        buffered = self.buffered
        if buffered.pending is not None:
            chunk, buffered.pending = await buffered.pending, None
            if chunk is None:
                buffered.is_ended = True
            else:
                return self.for_client(chunk)
        if buffered.is_ended:
            raise StopAsyncIteration
        return self.for_client(await anext(buffered.rest))

    async def aclose(self) -> None:
        await self.buffered.aclose()
