from __future__ import annotations

import pytest

from switchyard.backends.sse import SSEDecodeError, SSEEvents, iter_sse_data


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


BODY = (
    b': keep-alive\r\n\r\ndata: {"a": 1}\n\nevent: message\nid: 3\ndata: line1\ndata:line2\n\n'
    b'data: {"b": 2}\r\n\r\n\n\ndata: {"c": 3}\n\ndata: [DONE]\n\ndata: {"after": 1}\n\n'
)


@pytest.mark.parametrize("cut", range(len(BODY) + 1))
async def test_the_events_are_the_same_wherever_the_reads_end(cut):
    """One read or two, cut at every byte (a CRLF split too): the same payloads, and [DONE] ends them."""
    expected = [b'{"a": 1}', b"line1\nline2", b'{"b": 2}', b'{"c": 3}']
    assert await _collect([part for part in (BODY[:cut], BODY[cut:]) if part]) == expected
    events = SSEEvents()
    payloads = [*events.feed(BODY[:cut]), *events.feed(BODY[cut:]), *events.end()]
    assert payloads == expected and events.is_done


async def test_a_bad_line_comes_after_the_events_before_it_in_the_same_read():
    events = SSEEvents()
    assert events.feed(b'data: {"a": 1}\n\nnot an event\n\n') == [b'{"a": 1}']
    with pytest.raises(SSEDecodeError, match="not a server-sent event line"):
        events.feed(b"data: {}\n\n")
