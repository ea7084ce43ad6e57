"""One OpenTelemetry span per API request (`/v1/...`), when `tracing` is on (core/tracing.py).

The span is named after the method and path (`POST /v1/chat/completions`) and continues the trace
of a client that sent a W3C `traceparent`. Its attributes: the request id, the team and requested
model (annotated by the model-request handler and the relay), and from the response's own headers the
answering model, backend and route, and the status. Never prompt text, never a key.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchyard.core.tracing import Tracing, annotate_request, request_span
from switchyard.gateway.request_log import CLIENT_CLOSED_REQUEST

_TRACED_PREFIX = "/v1/"
_TRACE_CONTEXT = (b"traceparent", b"tracestate")
_HEADERS = {  # response header -> attribute (switchyard.<name>)
    b"x-switchyard-model": "model",
    b"x-switchyard-backend": "backend",
    b"x-switchyard-route": "route",
    b"x-switchyard-cascade": "cascade",
}


class RequestTracingMiddleware:
    """Runs each `/v1/` request inside its span (inside RequestIdMiddleware, whose id it records)."""

    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(_TRACED_PREFIX):
            await self.app(scope, receive, send)
            return
        headers = {  # only the trace context: the span never sees the other headers (a key among them)
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
            if name.lower() in _TRACE_CONTEXT
        }
        name = f"{scope.get('method', '')} {scope['path']}"
        with request_span(self.tracing, name, headers) as span:
            state = scope.get("state", {})
            annotate_request(request_id=state.get("request_id"), client_request_id=state.get("client_request_id"))
            status: list[int] = []

            async def send_noting_answer(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status.append(message["status"])
                    span.set_attribute("http.response.status_code", message["status"])
                    for header, value in message.get("headers", ()):
                        if header in _HEADERS:
                            span.set_attribute(f"switchyard.{_HEADERS[header]}", value.decode("latin-1"))
                await send(message)

            try:
                await self.app(scope, receive, send_noting_answer)
            except asyncio.CancelledError:
                if not status:
                    span.set_attribute("http.response.status_code", CLIENT_CLOSED_REQUEST)
                raise
            except Exception:
                if not status:
                    span.set_attribute("http.response.status_code", 500)  # RequestIdMiddleware answers it
                raise
