"""A chat completion stream, relayed as the Responses API's events, numbered by `sequence_number`.

    response.created, response.in_progress
    per output item, in order:
      message:       output_item.added, then per part (output_text or refusal) content_part.added,
                     output_text.delta... (refusal.delta...), then per part output_text.done
                     (refusal.done) and content_part.done, then output_item.done
      function_call: output_item.added, function_call_arguments.delta..., function_call_arguments.done,
                     output_item.done
    response.completed (or response.incomplete: the answer hit max_output_tokens)

A failure after the first event is an `error` event, then `response.failed`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from switchyard.core.chat_wire import ChatCompletionRequest, StreamChunk
from switchyard.core.errors import SwitchyardError
from switchyard.core.responses_wire import ResponsesRequest
from switchyard.gateway.answer_shape import AnswerShape
from switchyard.gateway.responses import (
    ResponseDraft,
    draft_for,
    function_call_item,
    message_item,
    new_id,
    responses_param,
    status_of,
    to_chat_request,
    usage_of,
    whole_response,
)
from switchyard.gateway.services import Services


class ResponsesShape(AnswerShape):
    """One request's answer as a Response object, or as its stream of events."""

    def __init__(self, draft: ResponseDraft) -> None:
        self.draft = draft
        self._sequence_number = 0
        self._items: list[dict[str, Any]] = []  # by output_index, as they stand
        self._open: int | None = None  # the output_index of the item still receiving deltas
        self._calls: dict[int, int] = {}  # a tool call's index in the chat stream -> its output_index
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None
        self._model: str | None = None
        self._is_started = self._has_failed = False

    def refusal(self, exc: SwitchyardError) -> bytes:
        """Refused before the first byte: the parameter named as the client sent it (`text.format`,
        not `response_format`)."""
        exc.param = responses_param(exc.param)
        return super().refusal(exc)

    def whole(self, data: bytes) -> bytes:
        return whole_response(self.draft, data)

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = orjson.dumps({"type": kind, "sequence_number": self._sequence_number} | fields)
        self._sequence_number += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def _response(self, status: str, **fields: Any) -> dict[str, Any]:
        response = self.draft.response(status, [dict(item) for item in self._items], **fields)
        if self._model:
            response["model"] = self._model
        return response

    def _start(self) -> list[bytes]:
        if self._is_started:
            return []
        self._is_started = True
        response = self._response("in_progress")  # the answering model's name, as in every later event
        return [
            self._event("response.created", response=response),
            self._event("response.in_progress", response=response),
        ]

    def events(self, chunk: StreamChunk) -> Iterable[bytes]:
        parsed = chunk.parsed
        self._model = parsed.get("model") or self._model
        out = self._start()
        if parsed.get("usage"):
            self._usage = parsed["usage"]
        for choice in parsed.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            if delta.get("refusal"):
                out += self._refusal(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return out

    def _part(self, kind: str) -> tuple[dict[str, Any], int, list[bytes]]:
        """The open message item and the index of its last part, of `kind` (output_text or refusal),
        opening either when needed, with the events that announce them."""
        out: list[bytes] = []
        if self._open is None or self._items[self._open]["type"] != "message":
            out += self._close()
            self._open = len(self._items)
            item = message_item(new_id("msg"), "", status="in_progress") | {"content": []}
            self._items.append(item)
            out.append(self._event("response.output_item.added", output_index=self._open, item={**item, "content": []}))
        item = self._items[self._open]
        parts = item["content"]
        if not parts or parts[-1]["type"] != kind:
            parts.append(message_item("", "")["content"][0] if kind == "output_text" else {"type": kind, "refusal": ""})
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._open,
                    content_index=len(parts) - 1,
                    part=dict(parts[-1]),
                )
            )
        return item, len(parts) - 1, out

    def _text(self, text: str) -> list[bytes]:
        item, index, out = self._part("output_text")
        item["content"][index]["text"] += text
        ids = {"item_id": item["id"], "output_index": self._open, "content_index": index}
        out.append(self._event("response.output_text.delta", **ids, delta=text, logprobs=[]))
        return out

    def _refusal(self, text: str) -> list[bytes]:
        item, index, out = self._part("refusal")
        item["content"][index]["refusal"] += text
        ids = {"item_id": item["id"], "output_index": self._open, "content_index": index}
        out.append(self._event("response.refusal.delta", **ids, delta=text))
        return out

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        index = call.get("index", 0)
        function = call.get("function") or {}
        if index not in self._calls:
            out += self._close()
            self._open = self._calls[index] = len(self._items)
            item = function_call_item(new_id("fc"), {**call, "function": {**function, "arguments": ""}}, "in_progress")
            self._items.append(item)
            out.append(self._event("response.output_item.added", output_index=self._open, item=item))
        output_index = self._calls[index]
        item = self._items[output_index]
        if function.get("name") and not item["name"]:
            item["name"] = function["name"]
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=output_index,
                    delta=function["arguments"],
                )
            )
        return out

    def _close(self, status: str = "completed") -> list[bytes]:
        """The events that finish the open item, if there is one."""
        if self._open is None:
            return []
        output_index, self._open = self._open, None
        item = self._items[output_index]
        item["status"] = status
        out: list[bytes] = []
        if item["type"] == "message":
            for index, part in enumerate(item["content"]):
                ids = {"item_id": item["id"], "output_index": output_index, "content_index": index}
                if part["type"] == "refusal":
                    out.append(self._event("response.refusal.done", **ids, refusal=part["refusal"]))
                else:
                    out.append(self._event("response.output_text.done", **ids, text=part["text"], logprobs=[]))
                out.append(self._event("response.content_part.done", **ids, part=part))
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=output_index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        out.append(self._event("response.output_item.done", output_index=output_index, item=item))
        return out

    def failed(self, exc: SwitchyardError) -> bytes:
        self._has_failed = True
        out = self._start()
        error = {"code": exc.code, "message": exc.message}
        out.append(self._event("error", code=exc.code, message=exc.message, param=exc.param))
        out.append(self._event("response.failed", response=self._response("failed", error=error)))
        return b"".join(out)

    def end(self) -> bytes:
        if self._has_failed:
            return b""
        status, incomplete = status_of(self._finish_reason)
        out = self._start() + self._close("completed" if status == "completed" else "incomplete")
        response = self._response(status, incomplete_details=incomplete, usage=usage_of(self._usage))
        out.append(self._event(f"response.{status}", response=response))
        return b"".join(out)


def as_chat_request(asked: ResponsesRequest, services: Services) -> tuple[ChatCompletionRequest, ResponsesShape]:
    """A Responses API request as the chat request the relay runs, and the shape its answer takes."""
    return to_chat_request(asked, services.settings.server.body_limits()), ResponsesShape(draft_for(asked))
