"""A stream's deadline: one timer cuts it with an in-band BackendTimeout; anyone else's
cancellation (a client gone, a shutdown) is never turned into a timeout nor swallowed."""

from __future__ import annotations

import asyncio

import pytest

from switchyard.backends.breaker import AttemptTickets, Breaker, BreakerPolicy
from switchyard.backends.deadlines import DeadlineStream
from switchyard.core.chat_wire import StreamChunk
from switchyard.core.errors import BackendTimeout
from switchyard.core.request_context import Deadline


class Upstream:
    """Two chunks, then nothing until closed (`stalled` is set once it waits)."""

    def __init__(self) -> None:
        self.is_closed = False
        self.stalled = asyncio.Event()

    async def chunks(self):
        try:
            for i in range(2):
                yield StreamChunk.from_dict({"i": i})
            self.stalled.set()
            await asyncio.Event().wait()
        finally:
            self.is_closed = True


def _stream(upstream: Upstream, in_s: float) -> DeadlineStream:
    deadline = Deadline(asyncio.get_running_loop().time() + in_s, "request deadline of 0.5 s")
    return DeadlineStream(upstream.chunks(), deadline, "m")


async def test_a_stalled_stream_is_cut_at_its_deadline_and_the_upstream_closed():
    upstream = Upstream()
    stream = _stream(upstream, 0.5)
    # The two chunks come without the loop running (the upstream never waits for them), so the
    # deadline's timer cannot fire before they are read, however late this machine is.
    assert [(await anext(stream)).parsed["i"] for _ in range(2)] == [0, 1]
    with pytest.raises(BackendTimeout, match="request deadline of 0.5 s"):
        await asyncio.wait_for(anext(stream), 30)  # the outer bound only catches a hang
    assert upstream.is_closed
    with pytest.raises(BackendTimeout):
        await anext(stream)  # past its deadline, it stays cut


async def test_someone_elses_cancellation_propagates():
    upstream = Upstream()
    stream = _stream(upstream, 30)
    await anext(stream)
    await anext(stream)
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(upstream.stalled.wait(), 30)  # the reader is waiting for the third chunk
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await stream.aclose()
    assert upstream.is_closed and stream._timer.cancelled()


async def test_a_finished_stream_drops_its_timer():
    async def two():
        yield StreamChunk.from_dict({"i": 0})

    stream = DeadlineStream(two(), Deadline(asyncio.get_running_loop().time() + 30, "x"), "m")
    assert [c.parsed["i"] async for c in stream] == [0]
    assert stream._timer.cancelled()


async def test_a_stream_cut_by_its_deadline_settles_its_tickets_neutral_for_the_breaker():
    clock = lambda: 100.0  # noqa: E731  # the breaker's own clock: nothing here waits on it
    breaker = Breaker(BreakerPolicy(fail_max=1, reset_s=10.0), clock)
    tickets = AttemptTickets([breaker.admit()])
    upstream = Upstream()
    deadline = Deadline(asyncio.get_running_loop().time() + 0.5, "request deadline of 0.5 s")
    stream = DeadlineStream(upstream.chunks(), deadline, "m", tickets)
    assert [(await anext(stream)).parsed["i"] for _ in range(2)] == [0, 1]
    with pytest.raises(BackendTimeout):
        await asyncio.wait_for(anext(stream), 30)
    assert tickets.tickets[0].is_settled and breaker.state == "closed" and breaker.num_failures == 0
