"""Time limits on one call: the first token's, the whole answer's, and a stream's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from switchyard.backends.breaker import AttemptTickets
from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import BackendTimeout, DeadlinePassed, FirstTokenTimeout
from switchyard.core.request_context import Deadline

T = TypeVar("T")


class DeadlineStream:
    """The rest of a stream, cut with DeadlinePassed (an in-band error; neutral for the breakers)
    once its deadline passes (the attempt's or the request's, whichever comes first).

    One timer for the whole stream, not a timeout per chunk (that would cost more than relaying the
    chunk): when it fires while a chunk is awaited, it cancels the awaiting task, and the
    cancellation becomes the timeout here, as `asyncio.timeout` does; a cancellation from anyone
    else propagates.

    A class, not an async generator: `aclose()` must close the upstream stream even when nobody
    ever iterated this (a client gone before the body started); an unstarted generator's
    `finally` never runs.

    With `tickets`, it also settles the attempt's breaker tickets as `SettlingStream` does (one
    wrapper a chunk goes through, not two).
    """

    def __init__(
        self, chunks: AsyncIterator[StreamChunk], deadline: Deadline, model: str, tickets: AttemptTickets | None = None
    ) -> None:
        self.chunks, self.deadline, self.model, self.tickets = chunks, deadline, model, tickets
        self._is_expired = self._has_cancelled = False
        self._waiter: asyncio.Task | None = None
        self._timer = asyncio.get_running_loop().call_at(deadline.ends_at, self._expire)

    def _expire(self) -> None:
        self._is_expired = True
        if self._waiter is not None:
            self._has_cancelled = True
            self._waiter.cancel()

    def __aiter__(self) -> DeadlineStream:
        return self

    async def __anext__(self) -> StreamChunk:
        try:
            if self._is_expired:
                raise await self._timed_out()
            task = asyncio.current_task()
            assert task is not None
            self._waiter, cancelling = task, task.cancelling()
            try:
                return await anext(self.chunks)
            except asyncio.CancelledError:
                if self._has_cancelled and task.uncancel() <= cancelling:
                    raise await self._timed_out() from None
                raise
            except StopAsyncIteration:
                self._timer.cancel()
                raise
            finally:
                self._waiter = None
        except StopAsyncIteration:
            if self.tickets is not None:
                self.tickets.settle(None)
            raise
        except BaseException as exc:
            if self.tickets is not None:
                self.tickets.settle(exc)
            raise

    async def _timed_out(self) -> DeadlinePassed:
        await self.chunks.aclose()  # type: ignore[attr-defined]
        return DeadlinePassed(self.deadline.reason, backend=self.model)

    async def aclose(self) -> None:
        self._timer.cancel()
        if self.tickets is not None:
            self.tickets.settle(asyncio.CancelledError())
        await self.chunks.aclose()  # type: ignore[attr-defined]


async def first_chunk(chunks: AsyncIterator[StreamChunk], timeout_s: float | None, model: str) -> StreamChunk | None:
    """The stream's first chunk (None: it ended empty), or FirstTokenTimeout after `timeout_s`."""
    if timeout_s is None:
        return await anext(chunks, None)
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await anext(chunks, None)
    except TimeoutError:
        if not timeout.expired():
            raise
        raise FirstTokenTimeout(f"{model}: no first token within {timeout_s:.3g} s", backend=model) from None


async def within(awaitable: Awaitable[T], timeout_s: float | None, model: str, what: str) -> T:
    """`awaitable`'s result, or BackendTimeout after `timeout_s`."""
    if timeout_s is None:
        return await awaitable
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await awaitable
    except TimeoutError:
        if not timeout.expired():
            raise
        raise BackendTimeout(f"{model}: no {what} within {timeout_s:g} s", backend=model) from None
