from __future__ import annotations

import pytest

from switchyard.backends.sse import SSEDecodeError, iter_sse_data


async def _collect(parts: list[bytes]) -> list[bytes]:
    async def gen():
        for part in parts:
            yield part

    return [data async for data in iter_sse_data(gen())]


async def test_events_split_across_reads():
    parts = [b'data: {"a"', b": 1}\n", b'\ndata: {"b": 2}\r\n\r\n', b"data: [DONE]\n\n", b"data: {}\n\n"]
    assert await _collect(parts) == [b'{"a": 1}', b'{"b": 2}']


async def test_comments_and_fields_are_skipped_and_multiline_joined():
    parts = [b": keep-alive\n\nevent: message\nid: 3\ndata: line1\ndata:line2\n\ndata: [DONE]\n\n"]
    assert await _collect(parts) == [b"line1\nline2"]


async def test_trailing_done_without_blank_line():
    assert await _collect([b'data: {"x": 1}\n\ndata: [DONE]\n']) == [b'{"x": 1}']


async def test_a_stream_cut_short_is_an_error():
    with pytest.raises(SSEDecodeError, match="without \\[DONE\\]"):
        await _collect([b'data: {"x": 1}\n\n'])


async def test_garbage_is_an_error():
    with pytest.raises(SSEDecodeError):
        await _collect([b"data: {}\n\nthis is not SSE\n\n"])
