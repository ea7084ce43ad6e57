"""Reading request bodies off the wire, within the server's limits, then validated
(`switchyard.gateway.parsing`)."""

from __future__ import annotations

import asyncio

from fastapi import Request

from switchyard.core.errors import InvalidRequest, RequestTooLarge
from switchyard.core.settings import ServerSettings
from switchyard.gateway.parsing import M, parse_body


async def read_body(request: Request, max_bytes: int, timeout_s: float | None = None) -> bytes:
    """The body, up to `max_bytes`; one that has not all arrived within `timeout_s` (a client that
    sent less than its Content-Length, or sends it a trickle at a time) is a 400, not a hang."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestTooLarge(f"Request body is {declared} bytes; the limit is {max_bytes}.")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > max_bytes:
                    raise RequestTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
                parts.append(part)
    except TimeoutError:
        raise InvalidRequest(
            f"The request body did not arrive within {timeout_s:g} s (server.body_timeout_s): "
            f"{size} of {declared or 'an unknown number of'} bytes came.",
            code="body_timeout",
        ) from None
    return b"".join(parts)


async def read_request(request: Request, model: type[M], server: ServerSettings) -> M:
    """The request's body, read (up to the server's limits) and validated into `model`."""
    body = await read_body(request, server.max_body_bytes, server.body_timeout_s)
    return await parse_body(model, body, server.body_limits())
