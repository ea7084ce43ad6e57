"""The streams being relayed right now, so that a shutting-down server can end them properly.

When the server starts shutting down (`GracefulServer`, before uvicorn's grace period), each live
stream is interrupted: it sends an in-band error saying the server is shutting down, then
`[DONE]`, and is metered as cancelled with the tokens it sent — instead of being cut mid-answer
when the grace period runs out.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import uvicorn
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from switchyard.core.errors import SwitchyardError

logger = logging.getLogger("switchyard")


class ShuttingDown(SwitchyardError):
    status_code = 503
    error_type = "server_error"
    code = "server_shutting_down"


class LiveStreams:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self._ending: set[asyncio.Task] = set()

    def add(self, task: asyncio.Task | None) -> None:
        if task is not None:
            self._tasks.add(task)

    def discard(self, task: asyncio.Task | None) -> None:
        self._tasks.discard(task)
        self._ending.discard(task)

    def is_ending(self, task: asyncio.Task | None) -> bool:
        """Was this stream interrupted by `end_all` (and not by anything else since)?"""
        return task in self._ending and task is not None and task.cancelling() == 1

    def end_all(self) -> int:
        """Interrupt every live stream; each ends itself with an error event and [DONE]."""
        for task in self._tasks - self._ending:
            self._ending.add(task)
            task.cancel()
        return len(self._ending)


class EventStreamResponse(StreamingResponse):
    """Starlette's `StreamingResponse`, sent from the request's own task.

    Starlette watches for the client leaving with an anyio task group around the stream; its
    setup and teardown were ~4% of a relayed stream's CPU. Here one asyncio task waits for the
    disconnect and cancels the request's task; that cancellation, and only that one, ends the
    stream quietly (the body's `finally` meters what it sent), and the background runs as before.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        this = asyncio.current_task()
        assert this is not None
        left: list[bool] = []
        watcher = asyncio.ensure_future(cancel_when_client_leaves(receive, this, left))
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not left or this.cancelling() > 1:
                raise  # not (only) the client leaving: the server is stopping
            this.uncancel()
        finally:
            watcher.cancel()
        if self.background is not None:
            await self.background()


async def cancel_when_client_leaves(receive: Receive, task: asyncio.Task, left: list[bool]) -> None:
    """The request body has been read already: the next message can only be the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass
    left.append(True)
    task.cancel()


class GracefulServer(uvicorn.Server):
    """uvicorn, which first tells the app's live streams to end before its graceful shutdown.

    Once started (the app's services built, its models loaded), what the process holds is frozen
    out of the garbage collector's sight (`gc.freeze`): the libraries and models loaded at startup
    are hundreds of thousands of objects that live as long as the process, and a full collection
    walked every one of them again, tens of milliseconds each time (measured: 20 full collections in
    7 s of load, 0.75 s in all). Collections then look at what requests create only."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        gc.collect()
        gc.freeze()

    async def shutdown(self, sockets=None) -> None:
        services = getattr(getattr(self.config.app, "state", None), "services", None)
        streams = getattr(services, "streams", None)
        if streams is not None and (count := streams.end_all()):
            logger.info("shutting down: ending %d stream(s) with an error event and [DONE]", count)
        await super().shutdown(sockets)
