"""Server-sent events, read from an upstream byte stream."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

DONE = b"[DONE]"


class SSEDecodeError(ValueError):
    """The upstream sent bytes that are not server-sent events."""


class SSEEvents:
    """The `data` payload of each event, from reads of any size: `feed()` returns the payloads of
    the events a read completes, `end()` the one left when the body ends. After `[DONE]`
    (`is_done`) the rest is ignored; a body that ends without it was cut short, and whoever reads
    raises for that once the payloads before it are out.

    Multi-line data fields are joined with newlines, as the SSE spec says; comments (`:`), `event`,
    `id` and `retry` fields are skipped.
    """

    __slots__ = ("_buffer", "_pending", "is_done")

    def __init__(self) -> None:
        self._buffer = b""  # the event that has not ended yet, as it came
        self._pending: SSEDecodeError | None = None  # a bad line after good events in one read
        self.is_done = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """Raises SSEDecodeError for a line that is not an event's, once the events before it are out."""
        if self._pending is not None:
            raise self._pending
        payloads: list[bytes] = []
        if self.is_done:
            return payloads
        text = self._buffer + chunk if self._buffer else chunk
        if b"\r" in text:  # CRLF lines: the general path, line by line
            lines = text.split(b"\n")
            self._buffer = lines.pop()
            if self._buffer or (lines and lines[-1].rstrip(b"\r")):  # the event goes on: keep its lines
                ends = _last_blank(lines)
                self._buffer = b"\n".join([*lines[ends:], self._buffer])
                lines = lines[:ends]
            self._dispatch(lines + [b""], payloads)
            return payloads
        # one split per read into whole events: most are one `data:` line, taken without a line loop
        events = text.split(b"\n\n")
        self._buffer = events.pop()
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                if event == b"data: [DONE]":
                    self.is_done = True
                    break
                payloads.append(event[6:])
            elif event and not self._dispatch([*event.split(b"\n"), b""], payloads):
                break
        return payloads

    def end(self) -> list[bytes]:
        """The last event, when the body ends without the blank line after it (its lines that ended)."""
        if self._pending is not None:
            raise self._pending
        payloads: list[bytes] = []
        if not self.is_done and self._buffer:
            lines = self._buffer.split(b"\n")[:-1]  # a line cut short is dropped
            self._buffer = b""
            self._dispatch([*lines, b""], payloads)
        return payloads

    def _dispatch(self, lines: list[bytes], payloads: list[bytes]) -> bool:
        """The events of `lines` into `payloads`; False once reading must stop ([DONE], a bad line)."""
        data_lines: list[bytes] = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line.rstrip(b"\r")
            if not line:
                if data_lines:
                    payload = b"\n".join(data_lines)
                    data_lines = []
                    if payload == DONE:
                        self.is_done = True
                        return False
                    payloads.append(payload)
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
            elif not line.startswith((b":", b"event:", b"id:", b"retry:")):
                error = SSEDecodeError(f"not a server-sent event line: {line[:80]!r}")
                if not payloads:
                    raise error
                self._pending = error
                return False
        return True


def _last_blank(lines: list[bytes]) -> int:
    """Where the event still open at the end of `lines` begins: after their last blank line."""
    for i in range(len(lines) - 1, -1, -1):
        if not lines[i].rstrip(b"\r"):
            return i + 1
    return 0


async def iter_sse_data(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield the `data` payload of each event (see `SSEEvents`); stops after `[DONE]`."""
    events = SSEEvents()
    async for chunk in chunks:
        for payload in events.feed(chunk):
            yield payload
        if events.is_done:
            return
    for payload in events.end():
        yield payload
    if not events.is_done:
        raise SSEDecodeError("the stream ended without [DONE]")
