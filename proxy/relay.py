"""Hands a parsed request to the backend that serves its model and relays the answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from backends.base import AnyRequest, answered_by
from proxy.errors import SwitchyardError, error_body
from proxy.metering import RequestMeter, usage_of
from proxy.protocol import StreamChunk
from proxy.registry import ModelEntry
from proxy.routing import auto_not_configured

logger = logging.getLogger("switchyard")

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
DONE_EVENT = b"data: [DONE]\n\n"


def _answer_headers(entry: ModelEntry) -> dict[str, str]:
    return {
        "x-switchyard-model": entry.name,
        "x-switchyard-backend": answered_by.get() or entry.backend_kind,
    }


async def _choose(request: Request, parsed: AnyRequest) -> tuple[ModelEntry, dict[str, str]]:
    """Routing (for "auto"), then saturation; the headers that explain both."""
    state = request.app.state
    headers: dict[str, str] = {}
    if parsed.model == "auto":
        if state.auto_router is None:
            raise auto_not_configured()
        decision = await state.auto_router.route(parsed, request.headers.get("x-switchyard-quality"))
        entry = decision.entry
        headers["x-switchyard-route"] = decision.reason
        if decision.score is not None:
            headers["x-switchyard-score"] = f"{decision.score:.4f}"
    else:
        entry = state.registry.get(parsed.model)
    admission = await state.saturation.admit(entry, request.headers.get("x-switchyard-priority"))
    if admission.is_degraded:
        headers["x-switchyard-degraded"] = "1"
    return admission.entry, headers


async def relay(request: Request, parsed: AnyRequest) -> Response:
    state = request.app.state
    entry, route_headers = await _choose(request, parsed)
    meter = RequestMeter(state.ledger, state.prices, request.scope["state"]["request_id"], state.attempt_counts)
    if parsed.stream:
        return await _relay_stream(state.executor, entry, parsed, route_headers, meter)
    try:
        entry, result = await state.executor.complete(entry, parsed, meter)
    except asyncio.CancelledError:
        meter.finished(meter.current_entry or entry, "cancelled", None)
        raise
    meter.finished(entry, "completed", usage_of(result))
    return Response(result.data, media_type="application/json", headers=_answer_headers(entry) | route_headers)


def _client_wants_usage(parsed: AnyRequest) -> bool:
    return bool(parsed.stream_options and parsed.stream_options.include_usage)


def _without_usage(chunk: StreamChunk) -> StreamChunk | None:
    """A usage-carrying chunk as a client that did not ask for usage should see it (None: drop it)."""
    if not chunk.has_choices:
        return None
    payload = dict(chunk.parsed)
    payload.pop("usage")
    return StreamChunk.from_dict(payload)


async def _relay_stream(
    executor, entry: ModelEntry, parsed: AnyRequest, route_headers: dict[str, str], meter: RequestMeter
) -> Response:
    # Decide before the first byte: retries, fallbacks and errors up to the first chunk are real
    # HTTP outcomes; after it, only in-band errors remain.
    try:
        entry, first, chunks = await executor.stream(entry, parsed, meter)
    except asyncio.CancelledError:
        meter.finished(meter.current_entry or entry, "cancelled", None)
        raise
    headers = {**SSE_HEADERS, **_answer_headers(entry), **route_headers}
    body = _sse_body(first, chunks, include_usage=_client_wants_usage(parsed), meter=meter, entry=entry)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers)


async def _sse_body(
    first: StreamChunk | None,
    rest: AsyncIterator[StreamChunk],
    *,
    include_usage: bool,
    meter: RequestMeter,
    entry: ModelEntry,
) -> AsyncIterator[bytes]:
    usage, num_chunks, status, error = None, 0, "cancelled", None  # unless the loop below ends otherwise
    try:
        chunk: StreamChunk | None = first
        while chunk is not None:
            num_chunks += 1
            if chunk.has_usage:
                usage = chunk.parsed["usage"]
                if not include_usage:
                    chunk = _without_usage(chunk)
            if chunk is not None:
                yield b"data: " + chunk.data + b"\n\n"
            chunk = await anext(rest, None)
        status = "completed"
    except SwitchyardError as exc:
        status, error = "failed", exc.message
        logger.warning("stream failed after the first byte: %s", exc.message)
        yield b"data: " + error_body(exc) + b"\n\n"
    except Exception as exc:
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        logger.exception("stream failed after the first byte")
        yield b"data: " + error_body(SwitchyardError("The server had an internal error.")) + b"\n\n"
    finally:
        meter.finished(entry, status, usage, num_chunks, error)
        await rest.aclose()
    yield DONE_EVENT
