"""The request log: one line per API request (`/v1/...`), written once when the request ends.

The line is built from what the request's handler got back along the way (`switchyard.proxy.exchange`):
the caller, the request it parsed, and the relay's `Relayed` value, whose meter totals give tokens,
cost, the attempts made and the answering model's time to first token. The route, cascade path and
backend are the ones the client was told in its `x-switchyard-*` headers.

Never a key (only its id) and never prompt text unless `logging.prompts: true`; every line goes
through `redact_credentials`, so a URL with credentials in it is masked too. The line is rendered on
the event loop and written by a thread (`install_request_log_handler`): a slow stdout never holds a
request up.
"""

from __future__ import annotations

import atexit
import logging
import queue
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from logging.handlers import QueueHandler, QueueListener
from typing import Any

import orjson

from switchyard.billing.metering import RequestTotals
from switchyard.core.settings import LoggingSettings
from switchyard.core.urls import redact_credentials

LOGGER_NAME = "switchyard.requests"
logger = logging.getLogger(LOGGER_NAME)

CLIENT_CLOSED_REQUEST = 499  # nginx's code: the client left before the answer; only the logs read it


@dataclass(slots=True)
class RequestLine:
    """What is known of one request; `fields()` is the line."""

    request_id: str
    method: str
    path: str
    started_at: float  # unix seconds
    client_request_id: str | None = None
    team: str | None = None
    key_id: str | None = None
    requested_model: str | None = None
    is_stream: bool = False
    prompt: Any = None  # only with logging.prompts
    status: int | None = None
    model: str | None = None
    backend: str | None = None
    route: str | None = None
    cascade: str | None = None
    totals: RequestTotals | None = None

    def fields(self, duration_s: float) -> dict[str, Any]:
        totals = self.totals
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
            "model": self.model or (totals.answer_model if totals is not None else None),
            "backend": self.backend,
            "route": self.route,
            "cascade": self.cascade,
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


def write_line(line: RequestLine, duration_s: float, form: str) -> None:
    """Hand the line to the log's writer thread; a log line never fails a request."""
    try:
        if logger.isEnabledFor(logging.INFO):
            logger.info(render(line.fields(duration_s), form))
    except Exception:
        logging.getLogger("switchyard").exception("could not write the request log line")


def install_request_log_handler(settings: LoggingSettings) -> None:
    """Send the request log to stdout, one line each, unformatted (the line is already rendered),
    through a queue that a thread of its own writes out. Called by `switchyard serve`; an embedding
    application configures logging itself."""
    if not settings.requests:
        return
    if not any(getattr(handler, "_switchyard_requests", False) for handler in logger.handlers):
        lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        stdout = logging.StreamHandler(sys.stdout)
        stdout.setFormatter(logging.Formatter("%(message)s"))
        listener = QueueListener(lines, stdout)
        listener.start()
        atexit.register(listener.stop)  # the lines still queued are written before the process exits
        handler = QueueHandler(lines)
        handler._switchyard_requests = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
