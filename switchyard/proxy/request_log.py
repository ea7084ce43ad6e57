"""The request log: one line per API request (`/v1/...`), written once when the request ends.

`RequestLogMiddleware` opens a `RequestLine` in the request's scope state and writes it when the
response is over — answered, refused before routing (400, 401, 429), failed, or cancelled by a
client that left. Along the way, `authenticate` notes the caller (`note_caller`) and the relay
attaches the request's meter (`note_request`), whose totals give tokens, cost, the attempts made
and the answering model's time to first token. The route, cascade path and backend are read from
the response's own `x-switchyard-*` headers, so the log says what the client was told.

Never a key (only its id) and never prompt text unless `logging.prompts: true`; every line goes
through `redact_credentials`, so a URL with credentials in it is masked too.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from switchyard.backends.base import AnyRequest
from switchyard.billing.metering import RequestMeter
from switchyard.billing.teams import Principal
from switchyard.core.settings import LoggingSettings
from switchyard.core.tracing import annotate_request
from switchyard.core.urls import redact_credentials

LOGGER_NAME = "switchyard.requests"
logger = logging.getLogger(LOGGER_NAME)

_STATE_KEY = "request_line"
_LOGGED_PREFIX = "/v1/"
_HEADERS = {  # response header -> field
    b"x-switchyard-model": "model",
    b"x-switchyard-backend": "backend",
    b"x-switchyard-route": "route",
    b"x-switchyard-cascade": "cascade",
}
CLIENT_CLOSED_REQUEST = 499  # nginx's code: the client left before the answer; only the logs read it


@dataclass(slots=True)
class RequestLine:
    """What is known of one request so far; `fields()` is the line."""

    request_id: str
    method: str
    path: str
    started_at: float  # unix seconds
    started_monotonic: float
    client_request_id: str | None = None
    team: str | None = None
    key_id: str | None = None
    requested_model: str | None = None
    is_stream: bool = False
    include_prompt: bool = False  # logging.prompts
    prompt: Any = None
    meter: RequestMeter | None = None
    status: int | None = None
    answer_headers: dict[str, str] | None = None

    def fields(self, duration_s: float) -> dict[str, Any]:
        headers = self.answer_headers or {}
        totals = self.meter.totals if self.meter is not None else None
        fields: dict[str, Any] = {
            "time": datetime.fromtimestamp(self.started_at, UTC).isoformat(timespec="milliseconds"),
            "event": "request",
            "request_id": self.request_id,
            "client_request_id": self.client_request_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "team": self.team,
            "key_id": self.key_id,
            "requested_model": self.requested_model,
            "model": headers.get("model") or (totals.answer_model if totals is not None else None),
            "backend": headers.get("backend"),
            "route": headers.get("route"),
            "cascade": headers.get("cascade"),
            "stream": self.is_stream,
            "outcome": totals.answer_status if totals is not None else None,
            "attempts": totals.attempts if totals is not None else [],
            "prompt_tokens": totals.prompt_tokens if totals is not None else 0,
            "completion_tokens": totals.completion_tokens if totals is not None else 0,
            "cost_usd": round(totals.cost_usd, 10) if totals is not None else 0.0,
            "ttft_ms": _ms(totals.ttft_s) if totals is not None else None,  # streams and assembled answers
            "duration_ms": _ms(duration_s),
        }
        if self.prompt is not None:
            fields["prompt"] = self.prompt
        return fields


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None


def render(fields: dict[str, Any], form: str) -> str:
    """The line as written: JSON, or `key=value` pairs (values with spaces JSON-quoted)."""
    if form == "json":
        line = orjson.dumps(fields).decode()
    else:
        line = " ".join(f"{key}={_text_value(value)}" for key, value in fields.items() if value is not None)
    return redact_credentials(line)


def _text_value(value: Any) -> str:
    """A string as it is when it needs no quoting, else JSON (strings with spaces, lists, numbers)."""
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return value
    return orjson.dumps(value).decode()


def line_of(scope: Scope) -> RequestLine | None:
    return scope.get("state", {}).get(_STATE_KEY)


def note_caller(scope: Scope, principal: Principal | None) -> None:
    """The authenticated caller: its team and key id (never the key)."""
    if principal is not None:
        annotate_request(team=principal.team.name)
    line = line_of(scope)
    if line is not None and principal is not None:
        line.team, line.key_id = principal.team.name, principal.key.id


def note_request(scope: Scope, meter: RequestMeter, parsed: AnyRequest) -> None:
    """The parsed request and its meter; its messages or prompt only if `logging.prompts` is on."""
    annotate_request(requested_model=parsed.model, stream=bool(parsed.stream))
    line = line_of(scope)
    if line is None:
        return
    line.meter, line.requested_model, line.is_stream = meter, parsed.model, bool(parsed.stream)
    if line.include_prompt:
        line.prompt = parsed.model_dump(mode="json", include={"messages", "prompt"}, exclude_none=True)


class RequestLogMiddleware:
    """Writes one request-log line per `/v1/` request when its response is over (inside
    RequestIdMiddleware, whose id it logs)."""

    def __init__(self, app: ASGIApp, settings: LoggingSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(_LOGGED_PREFIX):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        line = RequestLine(
            request_id=state.get("request_id", ""),
            method=scope.get("method", ""),
            path=scope["path"],
            started_at=time.time(),
            started_monotonic=time.monotonic(),
            client_request_id=state.get("client_request_id"),
            include_prompt=self.settings.prompts,
        )
        state[_STATE_KEY] = line

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                line.status = message["status"]
                line.answer_headers = {
                    _HEADERS[name]: value.decode("latin-1")
                    for name, value in message.get("headers", ())
                    if name in _HEADERS
                }
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except asyncio.CancelledError:
            line.status = line.status or CLIENT_CLOSED_REQUEST
            raise
        except Exception:
            line.status = line.status or 500  # RequestIdMiddleware answers it
            raise
        finally:
            self._write(line)

    def _write(self, line: RequestLine) -> None:
        try:
            fields = line.fields(time.monotonic() - line.started_monotonic)
            logger.info(render(fields, self.settings.format))
        except Exception:  # a log line must never fail a request
            logging.getLogger("switchyard").exception("could not write the request log line")


def install_request_log_handler(settings: LoggingSettings) -> None:
    """Send the request log to stdout, one line each, unformatted (the line is already rendered).
    Called by `switchyard serve`; an embedding application configures logging itself."""
    if not settings.requests:
        return
    if not any(getattr(handler, "_switchyard_requests", False) for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._switchyard_requests = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
