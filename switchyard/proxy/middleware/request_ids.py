"""Every request's id (`x-request-id`), the requests in flight (for the drain at shutdown), and the
last line of defence against an exception no handler caught."""

from __future__ import annotations

import asyncio
import logging
import os
import random

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchyard.core.errors import SwitchyardError, error_body

logger = logging.getLogger("switchyard")

# Request ids: 128 random bits from a generator seeded once from the OS (and again in a forked
# child), not a system call per request as uuid4() makes (on some kernels and sandboxes it costs
# 20 us). Ids only need to be unique; nothing is derived from them.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_request_id() -> str:
    return f"req_{_ids.getrandbits(128):032x}"


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if 0 < len(value) <= 128 and value.isascii() and value.decode().isprintable():
                return value.decode()
            return None
    return None


class InFlight:
    """The tasks serving requests right now, so that shutdown can wait for them (bounded)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()

    async def drain(self, timeout_s: float) -> None:
        pending = {task for task in self.tasks if task is not asyncio.current_task()}
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        if late:
            logger.warning("%d request(s) still running after the %.0f s drain", len(late), timeout_s)


class RequestIdMiddleware:
    """Gives every request the proxy's own id and puts it on the response (`x-request-id`).

    A client's own `x-request-id` (if sane) is kept beside it for correlation — in the ledger and
    echoed back as `x-client-request-id` — never used as the key of anything.

    It is also the last line of defence: an exception that escaped every handler becomes an
    OpenAI-shaped 500, never a stack trace.
    """

    def __init__(self, app: ASGIApp, in_flight: InFlight | None = None) -> None:
        self.app = app
        self.in_flight = in_flight if in_flight is not None else InFlight()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        client_request_id = _client_request_id(scope)
        state = scope.setdefault("state", {})
        state["request_id"], state["client_request_id"] = request_id, client_request_id
        header = (b"x-request-id", request_id.encode())
        headers = [header] + ([(b"x-client-request-id", client_request_id.encode())] if client_request_id else [])
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        task = asyncio.current_task()
        if task is not None:
            self.in_flight.tasks.add(task)
        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # expected: an aborted upload is one line, not a traceback
            logger.info("request %s: the client left before its body arrived", request_id)
        except Exception:
            logger.exception("unhandled error in request %s", request_id)
            if response_started:
                raise
            body = error_body(SwitchyardError("The server had an internal error."))
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json"), *headers],
                }
            )
            await send({"type": "http.response.body", "body": body})
        finally:
            self.in_flight.tasks.discard(task)
