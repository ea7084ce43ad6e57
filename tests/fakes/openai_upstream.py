"""A fake OpenAI-compatible upstream: a real HTTP server on 127.0.0.1 that speaks OpenAI's wire
format, with scripted latency, tokens, logprobs and failure modes.

Behaviour comes from `FakeBehaviour` on the server, and any request may override it with a
`"fake": {...}` body field (a client field the proxy forwards untouched); `POST /fake/behaviour`
with the same fields changes it for every later request. Failure modes:

    "400"        answer 400 content_policy_violation (a refusal no retry can fix), `param` error_param
    "context"    answer 400 context_length_exceeded
    "500"        answer 500 with an OpenAI error body
    "429"        answer 429 with `Retry-After` (none when `retry_after_s` is None)
    "hang"       accept the request and never answer
    "headers"    send the status line and headers, then nothing
    "stall"      stream `drop_after` chunks, then nothing (the connection stays open)
    "drop"       stream `drop_after` chunks, then close the connection mid-body
    "malformed"  stream one good chunk, then bytes that are not server-sent events
    "bad_shape"  stream one good chunk, then valid JSON that is not a chunk (a string `delta`)

A chat request with `tools` (unless `tool_choice` is "none" or the last message is a tool's result)
is answered with `num_tool_calls` calls of its tools in turn (each of `tool_name` when set), each
with `tool_arguments`, in OpenAI's format: `message.tool_calls`, or streamed `delta.tool_calls`
(index, id and name first, then the arguments in fragments), and finish_reason "tool_calls".
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import math
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.server import read_body

WAIT_FOR_BOUND_S = 60.0  # a `wait_for` gate nobody sets: the fake answers after this, and the test fails
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@dataclass
class FakeBehaviour:
    num_tokens: int = 5
    latency_s: float = 0.0
    token_delay_s: float = 0.0
    failure: str | None = None
    drop_after: int = 2
    retry_after_s: int | None = 7  # None: a 429 without Retry-After
    sends_usage: bool = True  # False: ignores stream_options.include_usage, as some older servers do
    logprobs: list[float] | None = None  # per token; default: -0.1 * (i + 1)
    fail_times: int | None = None  # the failure applies to this many requests, then the server recovers
    words: tuple[str, ...] = WORDS
    wait_for: threading.Event | None = None  # answer only once it is set (e.g. another fake's `arrived`)
    error_param: str | None = None  # the `param` of the "400" failure's error
    num_tool_calls: int = 1
    tool_arguments: str = '{"city": "Paris"}'
    tool_name: str | None = None  # the tool every call names; None: the request's tools in turn

    def updated(self, override: dict[str, Any] | None) -> FakeBehaviour:
        return dataclasses.replace(self, **override) if override else self


@dataclass
class FakeRecord:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    started_at: float
    disconnected_at: float | None = None


@dataclass
class FakeState:
    behaviour: FakeBehaviour = field(default_factory=FakeBehaviour)
    records: list[FakeRecord] = field(default_factory=list)
    num_requests: int = 0
    model_id: str = "fake-model"
    is_dead: bool = False  # every stream in flight drops its connection at its next chunk
    arrived: threading.Event = field(default_factory=threading.Event)  # set once a request has been counted
    models_status: int = 200  # what GET /v1/models (the proxy's health probe) answers: 503 while "loading"


def _token(behaviour: FakeBehaviour, i: int) -> str:
    return behaviour.words[i % len(behaviour.words)] + " "


def _logprob(behaviour: FakeBehaviour, i: int) -> float:
    if behaviour.logprobs is not None:
        return behaviour.logprobs[i % len(behaviour.logprobs)]
    return -0.1 * (i + 1)


def _token_logprob(behaviour: FakeBehaviour, i: int, num_top: int) -> dict[str, Any]:
    token, logprob = _token(behaviour, i), _logprob(behaviour, i)
    rest = math.log(max(1e-9, 1.0 - math.exp(logprob)))
    top = [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]
    for k in range(1, num_top):
        alt = f"alt{k} "
        top.append({"token": alt, "logprob": rest - k, "bytes": list(alt.encode())})
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": top}


def _completion_logprob(behaviour: FakeBehaviour, i: int, num_top: int, offset: int) -> dict[str, Any]:
    token, logprob = _token(behaviour, i), _logprob(behaviour, i)
    top = {token: logprob} | {f"alt{k} ": logprob - k for k in range(1, num_top)}
    return {"tokens": [token], "token_logprobs": [logprob], "top_logprobs": [top], "text_offset": [offset]}


def _finish_reason(body: dict[str, Any], behaviour: FakeBehaviour) -> str:
    return "length" if _num_tokens(body, behaviour) < behaviour.num_tokens else "stop"


FAKE_EMBEDDING_DIM = 8


def fake_vector(item: str | list[int], dimensions: int = FAKE_EMBEDDING_DIM) -> list[float]:
    """A fixed vector per input (from its hash), so tests can tell which input got which row."""
    seed = hashlib.sha256(orjson.dumps(item)).digest()
    return [round((seed[i % len(seed)] - 128) / 128, 6) for i in range(dimensions)]


def fake_embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's embeddings answer: a vector per input (base64 of float32 when asked), one token a word."""
    given = body.get("input")
    items = [given] if isinstance(given, str) or (given and isinstance(given[0], int)) else list(given or [])
    vectors = [fake_vector(item, body.get("dimensions") or FAKE_EMBEDDING_DIM) for item in items]
    if body.get("encoding_format") == "base64":
        data: list[Any] = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
    else:
        data = vectors
    tokens = sum(len(item.split()) if isinstance(item, str) else len(item) for item in items)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(data)],
        "model": body.get("model", ""),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _usage(body: dict[str, Any], behaviour: FakeBehaviour) -> dict[str, int]:
    prompt = orjson.dumps(body.get("messages") or body.get("prompt") or "")
    prompt_tokens = max(1, len(prompt) // 4)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": behaviour.num_tokens,
        "total_tokens": prompt_tokens + behaviour.num_tokens,
    }


def _num_tokens(body: dict[str, Any], behaviour: FakeBehaviour) -> int:
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    return min(behaviour.num_tokens, limit) if limit else behaviour.num_tokens


def _tool_calls(body: dict[str, Any], behaviour: FakeBehaviour) -> list[dict[str, Any]]:
    """The calls a chat request with tools is answered with (none once a tool has answered)."""
    tools, messages = body.get("tools"), body.get("messages") or [{}]
    if not tools or body.get("tool_choice") == "none" or messages[-1].get("role") == "tool":
        return []
    return [
        {
            "id": f"call_fake_{i}",
            "type": "function",
            "function": {
                "name": behaviour.tool_name or tools[i % len(tools)]["function"]["name"],
                "arguments": behaviour.tool_arguments,
            },
        }
        for i in range(behaviour.num_tool_calls)
    ]


def _tool_call_deltas(calls: list[dict[str, Any]]):
    """OpenAI's streamed tool calls: per call, its index, id and name with no arguments, then the
    arguments in fragments that carry only the index."""
    for index, call in enumerate(calls):
        function = call["function"]
        yield {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        arguments = function["arguments"]
        for start in range(0, len(arguments), 4):
            yield {"index": index, "function": {"arguments": arguments[start : start + 4]}}


def _error(status: int, message: str, error_type: str, code: str | None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


async def _gate(event: threading.Event) -> None:
    """Until `event` is set; bounded, so that a test that never sets it fails, not hangs. Waited in
    short slices, so that a server shutting down never waits long for the thread of a gate nobody set."""
    deadline = time.monotonic() + WAIT_FOR_BOUND_S
    while not await asyncio.to_thread(event.wait, 0.1) and time.monotonic() < deadline:
        pass


class FakeOpenAIUpstream:
    """The ASGI app. One instance per server; `state` is shared with the test thread."""

    def __init__(self, state: FakeState | None = None) -> None:
        self.state = state or FakeState()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/v1/models":
            if self.state.models_status != 200:
                await self._respond(send, self.state.models_status, _error(503, "loading", "server_error", None))
                return
            body = {
                "object": "list",
                "data": [{"id": self.state.model_id, "object": "model", "created": 0, "owned_by": "fake"}],
            }
            await self._respond(send, 200, orjson.dumps(body))
            return
        if method == "POST" and path == "/fake/behaviour":  # a script for a server in another process
            self.state.behaviour = self.state.behaviour.updated(orjson.loads(await read_body(receive)))
            await self._respond(send, 200, b"{}")
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            await self._respond(send, 404, _error(404, f"no route {path}", "invalid_request_error", None))
            return
        body = orjson.loads(await read_body(receive))
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        record = FakeRecord(path=path, body=body, headers=headers, started_at=time.monotonic())
        self.state.records.append(record)
        self.state.num_requests += 1
        self.state.arrived.set()
        behaviour = self.state.behaviour.updated(body.get("fake"))
        if behaviour.fail_times is not None and self.state.num_requests > behaviour.fail_times:
            behaviour = dataclasses.replace(behaviour, failure=None)
        await self._answer(scope, receive, send, body, behaviour, record)

    async def _respond(self, send, status: int, body: bytes, headers: list | None = None) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *(headers or [])],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope, receive, send, body, behaviour: FakeBehaviour, record: FakeRecord) -> None:
        if behaviour.wait_for is not None:
            await _gate(behaviour.wait_for)
        if behaviour.latency_s:
            try:  # a client that leaves while the fake "thinks" is recorded as leaving
                await asyncio.wait_for(self._wait_for_disconnect(receive, record), behaviour.latency_s)
                return
            except TimeoutError:
                pass
        if behaviour.failure == "400":
            await self._respond(
                send,
                400,
                _error(
                    400,
                    "Your request was rejected by the safety system.",
                    "invalid_request_error",
                    "content_policy_violation",
                    behaviour.error_param,
                ),
            )
            return
        if behaviour.failure == "context":
            await self._respond(
                send,
                400,
                _error(
                    400,
                    "This model's maximum context length is 16 tokens.",
                    "invalid_request_error",
                    "context_length_exceeded",
                ),
            )
            return
        if behaviour.failure == "500":
            await self._respond(send, 500, _error(500, "The fake upstream broke on purpose.", "server_error", None))
            return
        if behaviour.failure == "429":
            await self._respond(
                send,
                429,
                _error(429, "Rate limit reached for fake-model.", "requests", "rate_limit_exceeded"),
                [(b"retry-after", str(behaviour.retry_after_s).encode())]
                if behaviour.retry_after_s is not None
                else [],
            )
            return
        if behaviour.failure == "hang":
            await self._wait_for_disconnect(receive, record)
            return
        if behaviour.failure == "headers":
            content_type = b"text/event-stream" if body.get("stream") else b"application/json"
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
            await self._wait_for_disconnect(receive, record)
            return
        if scope["path"] == "/v1/embeddings":
            await self._respond(send, 200, orjson.dumps(fake_embeddings(body)))
            return
        is_chat = scope["path"] == "/v1/chat/completions"
        if body.get("stream"):
            await self._stream(receive, send, body, behaviour, record, is_chat)
        else:
            await self._respond(send, 200, orjson.dumps(self._completion(body, behaviour, is_chat)))

    async def _wait_for_disconnect(self, receive, record: FakeRecord) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                record.disconnected_at = time.monotonic()
                return

    def _completion(self, body, behaviour: FakeBehaviour, is_chat: bool) -> dict[str, Any]:
        n = _num_tokens(body, behaviour)
        text = "".join(_token(behaviour, i) for i in range(n))
        base = {"id": "cmpl-fake", "created": int(time.time()), "model": body.get("model", "")}
        base["system_fingerprint"] = "fp_fake"
        if is_chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": _finish_reason(body, behaviour),
            }
            if calls := _tool_calls(body, behaviour):
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
            if body.get("logprobs"):
                num_top = body.get("top_logprobs") or 0
                choice["logprobs"] = {"content": [_token_logprob(behaviour, i, num_top) for i in range(n)]}
            return {
                **base,
                "object": "chat.completion",
                "choices": [choice],
                "usage": _usage(body, behaviour),
            }
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish_reason(body, behaviour)}
        if body.get("logprobs") is not None:
            offsets = [len("".join(_token(behaviour, j) for j in range(i))) for i in range(n)]
            entries = [_completion_logprob(behaviour, i, body["logprobs"], offsets[i]) for i in range(n)]
            choice["logprobs"] = {key: [e[key][0] for e in entries] for key in entries[0]} if entries else None
        return {**base, "object": "text_completion", "choices": [choice], "usage": _usage(body, behaviour)}

    def _chunks(self, body, behaviour: FakeBehaviour, is_chat: bool):
        n = _num_tokens(body, behaviour)
        base = {"id": "chunk-fake", "created": int(time.time()), "model": body.get("model", "")}
        base["system_fingerprint"] = "fp_fake"
        obj = "chat.completion.chunk" if is_chat else "text_completion"
        num_top = body.get("top_logprobs") or 0
        offset = 0
        calls = _tool_calls(body, behaviour) if is_chat else []
        if calls:
            for i, delta in enumerate(_tool_call_deltas(calls)):
                delta = (
                    {"role": "assistant", "content": None, "tool_calls": [delta]} if i == 0 else {"tool_calls": [delta]}
                )
                yield {
                    **base,
                    "object": obj,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
                }
            n = 0
        for i in range(n):
            if is_chat:
                delta = (
                    {"role": "assistant", "content": _token(behaviour, i)}
                    if i == 0
                    else {"content": _token(behaviour, i)}
                )
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": [_token_logprob(behaviour, i, num_top)]}
            else:
                choice = {"index": 0, "text": _token(behaviour, i), "logprobs": None, "finish_reason": None}
                if body.get("logprobs") is not None:
                    choice["logprobs"] = _completion_logprob(behaviour, i, body["logprobs"], offset)
                offset += len(_token(behaviour, i))
            yield {**base, "object": obj, "choices": [choice]}
        finish_reason = "tool_calls" if calls else _finish_reason(body, behaviour)
        last: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if is_chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        yield {**base, "object": obj, "choices": [last]}
        if behaviour.sends_usage and (body.get("stream_options") or {}).get("include_usage"):
            yield {**base, "object": obj, "choices": [], "usage": _usage(body, behaviour)}

    async def _stream(self, receive, send, body, behaviour: FakeBehaviour, record: FakeRecord, is_chat: bool) -> None:
        watcher = asyncio.ensure_future(self._wait_for_disconnect(receive, record))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            for i, chunk in enumerate(self._chunks(body, behaviour, is_chat)):
                if watcher.done():
                    return
                if self.state.is_dead:
                    raise ConnectionAbortedError("fake upstream killed")
                if behaviour.failure == "drop" and i == behaviour.drop_after:
                    raise ConnectionAbortedError("fake upstream drops the stream on purpose")
                if behaviour.failure == "stall" and i == behaviour.drop_after:
                    await watcher
                    return
                if behaviour.failure == "bad_shape" and i == 1:  # valid JSON, not a chunk's shape
                    chunk = {**chunk, "choices": [{"index": 0, "delta": "not an object"}]}
                if behaviour.failure == "malformed" and i == 1:
                    await send({"type": "http.response.body", "body": b"this is not SSE\n\n", "more_body": True})
                    continue
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                        "more_body": True,
                    }
                )
                if behaviour.token_delay_s:
                    await asyncio.sleep(behaviour.token_delay_s)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        finally:
            if not watcher.done():
                watcher.cancel()


def create_fake_app() -> FakeOpenAIUpstream:
    """Factory for `uvicorn --factory`; `FAKE_NUM_TOKENS` sets the answer length."""
    import os

    behaviour = FakeBehaviour(num_tokens=int(os.environ.get("FAKE_NUM_TOKENS", "5")))
    return FakeOpenAIUpstream(FakeState(behaviour=behaviour))
