"""A fake Anthropic Messages API server (POST /v1/messages), streaming events and error bodies included.

A request with `tools` is answered with `tool_use` content blocks (one per tool, up to
`num_tool_calls`, each with `tool_input`; each calls `tool_name` when set) and stop_reason
"tool_use"; streamed, each block is a `content_block_start` carrying the tool's id and name, then
`input_json_delta` fragments. Once the last user message carries `tool_result` blocks, the answer
is text again.

Prompt caching as Anthropic's API does it: a request with `cache_control` breakpoints (on tools,
system blocks or message blocks) caches the prompt up to its last breakpoint, `cached_prefix_tokens`
tokens long. The first request with a prefix writes it (`cache_creation_input_tokens`), a later one
with the same prefix reads it (`cache_read_input_tokens`); `input_tokens` counts only the rest. A
stream's `message_start` carries the input and cache counts, its `message_delta` the output tokens.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.server import read_body


@dataclass
class AnthropicState:
    words: tuple[str, ...] = ("bonjour", "from", "claude")
    failure: str | None = None  # "429" | "529" (overloaded) | "400" | "401" (a key it does not know)
    token_delay_s: float = 0.0
    num_tool_calls: int = 1
    tool_input: dict[str, Any] = field(default_factory=lambda: {"city": "Paris"})
    tool_name: str | None = None  # the tool every call names; None: the request's tools in turn
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    cached_prefix_tokens: int = 2048  # a prompt's tokens up to its last cache_control breakpoint
    cached_prefixes: set[bytes] = field(default_factory=set)  # written to the cache, readable by a later request


def _error(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _has_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(block.get("type") == "tool_result" for block in content)


def _tool_uses(body: dict[str, Any], state: AnthropicState) -> list[dict[str, Any]]:
    tools, messages = body.get("tools"), body.get("messages") or [{}]
    if not tools or _has_tool_result(messages[-1]):
        return []
    return [
        {
            "type": "tool_use",
            "id": f"toolu_fake_{i}",
            "name": state.tool_name or tools[i % len(tools)]["name"],
            "input": state.tool_input,
        }
        for i in range(state.num_tool_calls)
    ]


def _tool_use_events(tool_uses: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    for index, block in enumerate(tool_uses):
        start = {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
        events.append(("content_block_start", start))
        partial = json.dumps(block["input"])
        for begin in range(0, len(partial), 5):
            delta = {"type": "input_json_delta", "partial_json": partial[begin : begin + 5]}
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _text_events(words: list[str]) -> list[tuple[str, dict[str, Any]]]:
    text_block = {"type": "text", "text": ""}
    events = [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": text_block})]
    for word in words:
        delta = {"type": "text_delta", "text": word}
        events.append(("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}))
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    return events


def _cached_prefix(body: dict[str, Any]) -> bytes | None:
    """The request's prompt up to and including its last `cache_control` block (tools, then
    system, then messages, Anthropic's order), None when it has no breakpoint."""
    system = body.get("system")
    blocks: list[Any] = list(body.get("tools") or []) + (system if isinstance(system, list) else [])
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks += content if isinstance(content, list) else [{"role": message.get("role"), "text": content}]
    marked = [i for i, block in enumerate(blocks) if isinstance(block, dict) and block.get("cache_control")]
    return orjson.dumps(blocks[: marked[-1] + 1]) if marked else None


def _input_usage(body: dict[str, Any], state: AnthropicState) -> dict[str, int]:
    prefix = _cached_prefix(body)
    if prefix is None:
        return {"input_tokens": 12}
    is_read = prefix in state.cached_prefixes
    state.cached_prefixes.add(prefix)
    cached = state.cached_prefix_tokens
    return {
        "input_tokens": 12,
        "cache_creation_input_tokens": 0 if is_read else cached,
        "cache_read_input_tokens": cached if is_read else 0,
    }


class FakeAnthropicUpstream:
    def __init__(self, state: AnthropicState | None = None) -> None:
        self.state = state or AnthropicState()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        raw = await read_body(receive)
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
        if self.state.failure == "401":
            await self._json(send, 401, _error("authentication_error", "invalid x-api-key"))
            return
        words = [w + " " for w in self.state.words][: body.get("max_tokens") or None]
        input_usage = _input_usage(body, self.state)
        usage = {**input_usage, "output_tokens": len(words)}
        tool_uses = _tool_uses(body, self.state)
        stop_reason = "tool_use" if tool_uses else "end_turn"
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
                        "content": tool_uses or [{"type": "text", "text": "".join(words)}],
                        "stop_reason": stop_reason,
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
                        "usage": {**input_usage, "output_tokens": 1},
                    },
                },
            ),
            ("ping", {"type": "ping"}),
        ]
        events += _tool_use_events(tool_uses) if tool_uses else _text_events(words)
        events += [
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
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
