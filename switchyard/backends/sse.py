"""Server-sent events, read from an upstream byte stream."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

DONE = b"[DONE]"


class SSEDecodeError(ValueError):
    """The upstream sent bytes that are not server-sent events."""


async def iter_sse_data(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """Yield the `data` payload of each event; stops after `[DONE]`.

    A stream that ends without `[DONE]` was cut short: SSEDecodeError, never a silent end.

    Multi-line data fields are joined with newlines, as the SSE spec says; comments (`:`), `event`,
    `id` and `retry` fields are skipped.
    """
    buffer = b""
    data_lines: list[bytes] = []
    async for chunk in chunks:
        # split once per read: slicing line by line would copy the rest of a large read each time
        lines = (buffer + chunk if buffer else chunk).split(b"\n")
        buffer = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line.rstrip(b"\r")
            if not line:
                if data_lines:
                    payload = b"\n".join(data_lines)
                    data_lines = []
                    if payload == DONE:
                        return
                    yield payload
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith((b":", b"event:", b"id:", b"retry:")):
                continue
            else:
                raise SSEDecodeError(f"not a server-sent event line: {line[:80]!r}")
    if data_lines:
        payload = b"\n".join(data_lines)
        if payload == DONE:
            return
        yield payload
    raise SSEDecodeError("the stream ended without [DONE]")
