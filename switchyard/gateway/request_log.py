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

import asyncio
import atexit
import logging
import os
import queue
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

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
    ttfb_s: float | None = None  # to the first byte of the answer's body, as the client saw it

    def fields(self, duration_s: float) -> dict[str, Any]:
        totals = self.totals
        fields: dict[str, Any] = {
            "time": _iso_ms(self.started_at),
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
            "ttfb_ms": _ms(self.ttfb_s),
            "duration_ms": _ms(duration_s),
        }
        if self.prompt is not None:
            fields["prompt"] = self.prompt
        return fields


class _Second:
    """The last second formatted, shared by the lines of that second."""

    unix_s = -1
    text = ""


def _iso_ms(unix_s: float) -> str:
    """`datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds")`, to the digit, at a
    tenth of its cost: a datetime per line was a third of the line's time."""
    second = int(unix_s)
    micros = round((unix_s - second) * 1e6)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    if second != _Second.unix_s:
        _Second.text = datetime.fromtimestamp(second, UTC).isoformat()[:-6]  # without the +00:00
        _Second.unix_s = second
    return f"{_Second.text}.{micros // 1000:03d}+00:00"


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
    """The line to stdout's writer thread (`switchyard serve`), else to the `switchyard.requests`
    logger (an application that embeds the proxy, tests); a log line never fails a request."""
    try:
        writer = _writer
        if writer is not None:
            writer.put(render(line.fields(duration_s), form))
        elif logger.isEnabledFor(logging.INFO):
            logger.info(render(line.fields(duration_s), form))
    except Exception:
        logging.getLogger("switchyard").exception("could not write the request log line")


class _LineWriter(logging.Handler):
    """The request log's lines to a stream, written by a thread of its own: the event loop only
    appends a line to a batch, and hands the batch over every `batch_wait_s` (or when it is large);
    the thread writes it with one write and one flush. A slow stdout never holds a request up, and
    neither thread wakes the other for every line."""

    batch_wait_s = 0.05
    max_batch = 2000

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.batch: list[str] = []
        self.fd = stream.fileno()
        self.batches: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._handing_over = False
        self.thread = threading.Thread(target=self._write_forever, name="switchyard-request-log", daemon=True)
        self.thread.start()
        atexit.register(self.close)  # the lines still waiting are written before the process exits

    def put(self, line: str) -> None:
        self.batch.append(line)
        if len(self.batch) >= self.max_batch:
            self._hand_over()
        elif not self._handing_over:
            try:
                asyncio.get_running_loop().call_later(self.batch_wait_s, self._hand_over)
                self._handing_over = True
            except RuntimeError:  # no event loop in this thread: hand it over at once
                self._hand_over()

    def _hand_over(self) -> None:
        self._handing_over = False
        if self.batch:
            batch, self.batch = self.batch, []
            self.batches.put(("\n".join(batch) + "\n").encode())

    def emit(self, record: logging.LogRecord) -> None:
        self.put(record.getMessage())

    def _write_forever(self) -> None:
        while (data := self.batches.get()) is not None:
            try:
                self.stream.flush()  # what else was printed first
                view = memoryview(data)
                while view:
                    view = view[os.write(self.fd, view) :]
            except Exception:  # a log line must never take the proxy down
                pass

    def close(self) -> None:
        if self.thread.is_alive():
            self._hand_over()
            self.batches.put(None)
            self.thread.join(timeout=5)
        super().close()


def install_request_log_handler(settings: LoggingSettings) -> None:
    """Send the request log to stdout, one line each, unformatted (the line is already rendered),
    written by a thread of its own. Called by `switchyard serve`; an embedding application
    configures logging itself."""
    global _writer
    if not settings.requests:
        return
    if _writer is None:
        _writer = _LineWriter(sys.stdout)
        logger.addHandler(_writer)  # what else logs to `switchyard.requests` goes the same way
    logger.setLevel(logging.INFO)
    logger.propagate = False


# The process's stdout writer, once `switchyard serve` installed it: lines skip the logging machinery
# (a LogRecord, and the caller's frame looked up, for every request).
_writer: _LineWriter | None = None
