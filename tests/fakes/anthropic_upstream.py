"""A fake Anthropic Messages API server (POST /v1/messages), streaming events and error bodies included."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class AnthropicState:
    words: tuple[str, ...] = ("bonjour", "from", "claude")
    failure: str | None = None  # "429" | "529" (overloaded) | "400"
    token_delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def _error(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


class FakeAnthropicUpstream:
    def __init__(self, state: AnthropicState | None = None) -> None:
        self.state = state or AnthropicState()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] != "/v1/messages":
            await self._json(send, 404, _error("not_found_error", f"no route {scope['path']}"))
            return
        body = orjson.loads(raw)
        self.state.requests.append(body)
        self.state.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if self.state.failure == "429":
            await self._json(
                send,
                429,
                _error("rate_limit_error", "Number of request tokens has exceeded your rate limit."),
                [(b"retry-after", b"2")],
            )
            return
        if self.state.failure == "529":
            await self._json(send, 529, _error("overloaded_error", "Overloaded"))
            return
        if self.state.failure == "400":
            await self._json(
                send, 400, _error("invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum")
            )
            return
        words = [w + " " for w in self.state.words][: body.get("max_tokens") or None]
        usage = {"input_tokens": 12, "output_tokens": len(words)}
        if not body.get("stream"):
            await self._json(
                send,
                200,
                orjson.dumps(
                    {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "model": body["model"],
                        "content": [{"type": "text", "text": "".join(words)}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": usage,
                    }
                ),
            )
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        events = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "model": body["model"],
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 12, "output_tokens": 1},
                    },
                },
            ),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            ("ping", {"type": "ping"}),
        ]
        events += [
            (
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}},
            )
            for w in words
        ]
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": len(words)},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        for name, data in events:
            await send(
                {
                    "type": "http.response.body",
                    "body": f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n",
                    "more_body": True,
                }
            )
            if self.state.token_delay_s:
                await asyncio.sleep(self.state.token_delay_s)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _json(self, send, status: int, body: bytes, headers=()) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})
