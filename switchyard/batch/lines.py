"""An input file checked as OpenAI checks it, line by line, as its parts are read.

Each non-empty line must be a JSON object with `custom_id` (a string, unique in the file),
`method` ("POST"), `url` (the batch's endpoint) and `body` (an object). A file with any line that
is not gives the batch's `errors`, each naming its line (1-based), and the batch fails at
`validating`. A well-formed line whose request the model refuses is not the validator's business:
it becomes an entry of the error file when it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
from dataclasses import dataclass, field

import orjson

MAX_ERRORS = 100  # listed in a batch's `errors`; the count says how many more there were


@dataclass(frozen=True, slots=True)
class Line:
    index: int  # 0-based, in the file
    custom_id: str
    start: int  # byte offset in the file
    length: int


@dataclass(frozen=True, slots=True)
class LineError:
    code: str
    message: str
    line: int | None = None  # 1-based
    param: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(slots=True)
class Checked:
    lines: list[Line] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    num_errors: int = 0

    def fail(self, error: LineError) -> None:
        self.num_errors += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(error)


async def check_lines(
    chunks: AsyncIterable[bytes], endpoint: str, max_lines: int, max_line_bytes: int = 4 * 1024 * 1024
) -> Checked:
    """Every line of the file, or the errors that fail it. Each chunk's lines are parsed on a
    worker thread: a file of thousands of lines never holds the event loop. Reading stops at the
    first line past `max_lines` or longer than `max_line_bytes`."""
    checker = _Checker(endpoint, max_lines, max_line_bytes)
    async for chunk in chunks:
        await asyncio.to_thread(checker.feed, chunk)
        if checker.is_stopped:
            break
    checker.end()
    checked = checker.checked
    if not checked.lines and not checked.num_errors:
        checked.fail(LineError("empty_file", "The input file has no requests."))
    return checked


class _Checker:
    """The file's lines as its bytes come, in order, a chunk at a time."""

    def __init__(self, endpoint: str, max_lines: int, max_line_bytes: int) -> None:
        self.endpoint = endpoint
        self.max_lines = max_lines
        self.max_line_bytes = max_line_bytes
        self.is_stopped = False
        self.checked = Checked()
        self.seen: set[str] = set()
        self.offset = 0  # of `rest` in the file
        self.number = 0  # lines so far
        self.rest = b""  # a line not ended yet

    def feed(self, chunk: bytes) -> None:
        data = self.rest + chunk
        start = 0
        while (end := data.find(b"\n", start)) >= 0 and not self.is_stopped:
            self._line(data[start:end], self.offset + start)
            start = end + 1
        self.offset += start
        self.rest = data[start:]
        if len(self.rest) > self.max_line_bytes and not self.is_stopped:
            self._stop(
                "line_too_long",
                f"Line {self.number + 1} is longer than {self.max_line_bytes} bytes.",
                self.number + 1,
            )

    def _line(self, raw: bytes, start: int) -> None:
        self.number += 1
        if len(raw) > self.max_line_bytes:
            self._stop("line_too_long", f"Line {self.number} is longer than {self.max_line_bytes} bytes.", self.number)
            return
        _check(raw, start, self.number, self.endpoint, self.seen, self.checked)
        if len(self.checked.lines) > self.max_lines:
            self._stop("too_many_requests", f"The file has more than {self.max_lines} requests (batch.max_lines).")

    def _stop(self, code: str, message: str, line: int | None = None) -> None:
        self.checked.fail(LineError(code, message, line))
        self.is_stopped = True
        self.rest = b""

    def end(self) -> None:
        if self.rest and not self.is_stopped:
            self._line(self.rest, self.offset)
            self.rest = b""


def _check(raw: bytes, start: int, number: int, endpoint: str, seen: set[str], checked: Checked) -> None:
    text = raw.rstrip(b"\r")
    if not text.strip():
        return
    try:
        item = orjson.loads(text)
    except orjson.JSONDecodeError:
        checked.fail(LineError("invalid_json_line", f"Line {number} is not valid JSON.", number))
        return
    if not isinstance(item, dict):
        checked.fail(LineError("invalid_json_line", f"Line {number} is not a JSON object.", number))
        return
    for name in ("custom_id", "method", "url", "body"):
        if name not in item:
            checked.fail(LineError("missing_required_parameter", f"Line {number} has no '{name}'.", number, name))
            return
    custom_id, method, url, body = item["custom_id"], item["method"], item["url"], item["body"]
    if not isinstance(custom_id, str) or not custom_id:
        checked.fail(LineError("invalid_value", f"Line {number}: 'custom_id' must be a string.", number, "custom_id"))
    elif method != "POST":
        checked.fail(LineError("invalid_value", f"Line {number}: 'method' must be POST.", number, "method"))
    elif url != endpoint:
        checked.fail(
            LineError(
                "mismatched_url",
                f"Line {number}: 'url' is {url!r}, but this batch's endpoint is {endpoint}.",
                number,
                "url",
            )
        )
    elif not isinstance(body, dict):
        checked.fail(LineError("invalid_value", f"Line {number}: 'body' must be an object.", number, "body"))
    elif custom_id in seen:
        checked.fail(
            LineError(
                "duplicate_custom_id",
                f"Line {number}: custom_id {custom_id!r} is used by an earlier line; each must be unique.",
                number,
                "custom_id",
            )
        )
    else:
        seen.add(custom_id)
        checked.lines.append(Line(len(checked.lines), custom_id, start, len(raw)))
