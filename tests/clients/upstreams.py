"""Fake upstreams that answer tools and JSON modes as a real model would, in each provider's wire
format, so that clients which parse tool calls or structured output get something to parse.

Each wraps the plain fake (tests/fakes/) and answers itself only what that one cannot: a request
with `tools` (OpenAI `tool_calls`, Anthropic `tool_use` blocks, streamed as deltas) or a
`response_format` (JSON built from the schema). Everything else, records included, goes to the
plain fake. A request whose last message is a tool result is answered in text, as after a call.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeRecord, FakeState
from tests.fakes.server import read_body

TOOL_CALL_ID = "call_fake_1"


def example_of(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> Any:
    """A small instance of a JSON schema: the first enum value, every property of an object."""
    defs = defs if defs is not None else schema.get("$defs", schema.get("definitions", {}))
    if "$ref" in schema:
        return example_of(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example_of(schema[key][0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: example_of(sub, defs) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [example_of(schema.get("items") or {"type": "string"}, defs)]
    return {"string": "paris", "integer": 3, "number": 1.5, "boolean": True, "null": None}[kind]


def _chosen_tool(tools: list[dict[str, Any]], tool_choice: Any) -> dict[str, Any]:
    """The tool named by `tool_choice` (OpenAI or Anthropic shape), else the first."""
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        for tool in tools:
            if name in ((tool.get("function") or {}).get("name"), tool.get("name")):
                return tool
    return tools[0]


def _answers_a_tool_result(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1] if messages else {}
    content = last.get("content")
    return last.get("role") == "tool" or (
        isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "tool_result" for p in content)
    )


def _replaying(raw: bytes, receive):
    """A `receive` that gives the body already read, then whatever the connection says next."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay


async def _send_json(send, body: dict[str, Any]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


async def _send_events(send, events: list[bytes]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _pieces(text: str, num_pieces: int = 3) -> list[str]:
    size = max(1, -(-len(text) // num_pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


class ToolingOpenAIUpstream:
    """OpenAI's chat wire format with `tool_calls` and JSON modes; the rest is `FakeOpenAIUpstream`."""

    def __init__(self, state: FakeState | None = None) -> None:
        self.plain = FakeOpenAIUpstream(state)
        self.state = self.plain.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions" or scope["method"] != "POST":
            await self.plain(scope, receive, send)
            return
        raw = await read_body(receive)
        body = orjson.loads(raw)
        message = self._message(body)
        if message is None:
            await self.plain(scope, _replaying(raw, receive), send)
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.state.records.append(FakeRecord(scope["path"], body, headers, time.monotonic()))
        self.state.num_requests += 1
        finish_reason = "tool_calls" if "tool_calls" in message else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        base = {"id": "chatcmpl-fake", "created": int(time.time()), "model": body.get("model", "")}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            await _send_json(send, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})
            return
        events = [self._chunk(base, delta) for delta in self._deltas(message)]
        events.append(self._chunk(base, {}, finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                b"data: "
                + orjson.dumps({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
                + b"\n\n"
            )
        await _send_events(send, [*events, b"data: [DONE]\n\n"])

    def _message(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The assistant message this fake answers itself, or None for the plain fake."""
        tools, tool_choice = body.get("tools"), body.get("tool_choice")
        if tools and tool_choice != "none" and not _answers_a_tool_result(body.get("messages") or []):
            function = _chosen_tool(tools, tool_choice)["function"]
            arguments = orjson.dumps(example_of(function.get("parameters") or {})).decode()
            call = {
                "id": TOOL_CALL_ID,
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_schema":
            content = orjson.dumps(example_of(response_format["json_schema"].get("schema") or {})).decode()
            return {"role": "assistant", "content": content}
        if response_format.get("type") == "json_object":
            return {"role": "assistant", "content": '{"answer": "paris"}'}
        return None

    @staticmethod
    def _deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
        if "tool_calls" not in message:
            return [{"role": "assistant", "content": ""}] + [{"content": p} for p in _pieces(message["content"])]
        call = message["tool_calls"][0]
        first = {
            "index": 0,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        rest = [{"index": 0, "function": {"arguments": p}} for p in _pieces(call["function"]["arguments"])]
        return [{"role": "assistant", "content": None, "tool_calls": [first]}] + [{"tool_calls": [r]} for r in rest]

    @staticmethod
    def _chunk(base: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return b"data: " + orjson.dumps({**base, "object": "chat.completion.chunk", "choices": [choice]}) + b"\n\n"


class ToolingAnthropicUpstream:
    """Anthropic's Messages wire format with `tool_use` blocks; the rest is `FakeAnthropicUpstream`."""

    def __init__(self, state: AnthropicState | None = None) -> None:
        self.plain = FakeAnthropicUpstream(state)
        self.state = self.plain.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/messages":
            await self.plain(scope, receive, send)
            return
        raw = await read_body(receive)
        body = orjson.loads(raw)
        tools, tool_choice = body.get("tools"), body.get("tool_choice") or {}
        if not tools or tool_choice.get("type") == "none" or _answers_a_tool_result(body.get("messages") or []):
            await self.plain(scope, _replaying(raw, receive), send)
            return
        self.state.requests.append(body)
        self.state.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        tool = _chosen_tool(tools, tool_choice)
        block = {
            "type": "tool_use",
            "id": "toolu_fake_1",
            "name": tool["name"],
            "input": example_of(tool["input_schema"]),
        }
        message = {"id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"]}
        if not body.get("stream"):
            usage = {"input_tokens": 12, "output_tokens": 7}
            await _send_json(
                send, {**message, "content": [block], "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}
            )
            return
        started = {
            **message,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 1},
        }
        deltas = [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": p}}
            for p in _pieces(orjson.dumps(block["input"]).decode())
        ]
        events = [
            {"type": "message_start", "message": started},
            {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
            *deltas,
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
            {"type": "message_stop"},
        ]
        await _send_events(send, [f"event: {e['type']}\ndata: ".encode() + orjson.dumps(e) + b"\n\n" for e in events])
