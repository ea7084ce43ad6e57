"""The OpenAI HTTP backend against raw sockets: what it does when a connection dies early."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from switchyard.backends.openai_http import OpenAIHTTPBackend, Replica
from switchyard.core.chat_wire import ChatCompletionRequest
from switchyard.core.errors import BackendUnavailable

ANSWER = (
    b'{"id":"x","object":"chat.completion","model":"m",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'
)
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _serve(close_first: int) -> tuple[asyncio.Server, list[int]]:
    """Close the first `close_first` connections after reading a request, answer on later ones."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        if len(connections) <= close_first:
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(ANSWER))
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections


async def _complete(server: asyncio.Server):
    port = server.sockets[0].getsockname()[1]
    async with aiohttp.ClientSession() as session:
        backend = OpenAIHTTPBackend("m", [Replica(f"http://127.0.0.1:{port}/v1")], session)
        return await backend.complete(ChatCompletionRequest.from_payload(dict(REQUEST)))


async def test_a_connection_closed_before_any_response_is_retried_once():
    server, connections = await _serve(close_first=1)
    async with server:
        result = await _complete(server)
    assert result.as_chat_completion().choices[0].message.content == "ok"
    assert len(connections) == 2


async def test_a_second_early_close_is_a_503():
    server, connections = await _serve(close_first=2)
    async with server:
        with pytest.raises(BackendUnavailable, match="dropped the connection"):
            await _complete(server)
    assert len(connections) == 2
