"""A chat completion stream, relayed as the Messages API's events.

    message_start (the message, empty), ping
    per content block, in order (thinking, text, tool_use as the chunks bring them):
      content_block_start, content_block_delta... (thinking_delta and signature_delta,
      text_delta, input_json_delta), content_block_stop
    message_delta (stop_reason, stop_sequence, the final usage), message_stop

A failure after the first event is an `error` event with Anthropic's error body. Errors refused
before the first byte are Anthropic's body with its status (`switchyard.core.messages_wire`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from switchyard.core.chat_wire import ChatCompletionRequest, StreamChunk
from switchyard.core.errors import SwitchyardError
from switchyard.core.messages_wire import MessagesRequest, error_body, error_status
from switchyard.gateway.answer_shape import AnswerShape
from switchyard.gateway.messages import (
    messages_param,
    new_message_id,
    reasoning_of,
    stop_of,
    to_chat_request,
    usage_of,
    whole_message,
)
from switchyard.gateway.services import Services


class MessagesErrors(AnswerShape):
    """Anthropic's error body and status, for a request refused before its first byte."""

    def refusal(self, exc: SwitchyardError) -> bytes:
        exc.param = messages_param(exc.param)
        return error_body(exc)

    def refusal_status(self, exc: SwitchyardError) -> int:
        return error_status(exc)

    def failed(self, exc: SwitchyardError) -> bytes:
        return b"event: error\ndata: " + error_body(exc) + b"\n\n"


MESSAGES_ERRORS = MessagesErrors()


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind} | fields) + b"\n\n"


class MessagesShape(MessagesErrors):
    """One request's answer as a Message, or as its stream of events."""

    def __init__(self, asked: MessagesRequest) -> None:
        self.asked = asked
        self._block: str | None = None  # the open block's type
        self._index = -1  # the open (else last) block's index
        self._calls: dict[int, int] = {}  # a tool call's index in the chat stream -> its block's index
        self._usage: dict[str, Any] | None = None
        self._choice: dict[str, Any] = {}
        self._is_started = self._has_failed = False

    def whole(self, data: bytes) -> bytes:
        return whole_message(self.asked, data)

    def _start(self) -> list[bytes]:
        if self._is_started:
            return []
        self._is_started = True
        message: dict[str, Any] = {
            "id": new_message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.asked.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_of(None),  # the counts come with message_delta, once the upstream gave them
        }
        return [_event("message_start", message=message), _event("ping")]

    def events(self, chunk: StreamChunk) -> Iterable[bytes]:
        parsed = chunk.parsed
        out = self._start()
        if parsed.get("usage"):
            self._usage = parsed["usage"]
        for choice in parsed.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = reasoning_of(delta)
            if reasoning:
                out += self._delta("thinking", {"type": "thinking_delta", "thinking": reasoning})
            for block in delta.get("thinking_blocks") or ():
                if isinstance(block, dict) and block.get("signature"):
                    out += self._delta("thinking", {"type": "signature_delta", "signature": block["signature"]})
            if delta.get("content"):
                out += self._delta("text", {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
            if choice.get("finish_reason"):
                self._choice = choice
        return out

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self._index += 1
        self._block = block["type"]
        return out + [_event("content_block_start", index=self._index, content_block=block)]

    def _close(self) -> list[bytes]:
        if self._block is None:
            return []
        self._block = None
        return [_event("content_block_stop", index=self._index)]

    def _delta(self, kind: str, delta: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if self._block != kind:
            empty = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            out += self._open(empty)
        out.append(_event("content_block_delta", index=self._index, delta=delta))
        return out

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        function = call.get("function") or {}
        number = call.get("index", 0)
        if number not in self._calls:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{new_message_id()[4:]}",
                "name": function.get("name") or "",
                "input": {},
            }
            out += self._open(block)
            self._calls[number] = self._index
        if function.get("arguments") and self._calls[number] == self._index and self._block == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
            out.append(_event("content_block_delta", index=self._index, delta=delta))
        return out

    def failed(self, exc: SwitchyardError) -> bytes:
        self._has_failed = True
        return b"".join(self._start()) + super().failed(exc)

    def end(self) -> bytes:
        if self._has_failed:
            return b""
        out = self._start() + self._close()
        stop_reason, stop_sequence = stop_of(self._choice, self.asked.stop_sequences)
        delta = {"stop_reason": stop_reason or "end_turn", "stop_sequence": stop_sequence}
        out.append(_event("message_delta", delta=delta, usage=usage_of(self._usage)))
        out.append(_event("message_stop"))
        return b"".join(out)


def as_chat_request(asked: MessagesRequest, services: Services) -> tuple[ChatCompletionRequest, MessagesShape]:
    """A Messages API request as the chat request the relay runs, and the shape its answer takes."""
    return to_chat_request(asked, services.settings.server.body_limits()), MessagesShape(asked)
