"""Streams on the wire: a streamed answer sent from the request's own task, the client's leaving
noticed, and a uvicorn server that first ends the live streams (`switchyard.gateway.live_streams`)
when it shuts down.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import uvicorn
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger("switchyard")


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


async def client_left(receive: Receive) -> None:
    """Returns when the client has left. The request body has been read already: the next message
    can only be the disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_when_client_leaves(receive: Receive, task: asyncio.Task, left: list[bool]) -> None:
    await client_left(receive)
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
