"""A whole answer put together from the chunks of a stream: what the upstream would have sent whole.

A non-stream request may be asked of the upstream as a stream (with `include_usage`) so that a
first-token timeout can guard it too (see backends/resilience.py). `AnswerAssembler` turns the
chunks back into the `ChatCompletion` or `Completion` the client asked for: text and refusals
joined, tool-call and function-call deltas merged by index, logprobs entries concatenated, one
choice per `index` (n > 1, or a batch of prompts), the last `finish_reason`, the usage chunk's
counts, and `id`, `created`, `model`, `system_fingerprint` as the chunks carry them. Fields it does
not know are kept: strings joined (`reasoning_content`), anything else as last sent.
"""

from __future__ import annotations

from typing import Any

import orjson

from switchyard.core.chat_wire import CompletionResult, StreamChunk
from switchyard.core.errors import BackendError

_CHOICE_KEYS = frozenset(("index", "delta", "text", "logprobs", "finish_reason"))
_NOT_HEAD = ("choices", "usage", "object")
_COMPLETION_LOGPROBS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class _Choice:
    __slots__ = (
        "index",
        "is_chat",
        "texts",
        "fields",
        "tool_calls",
        "function_call",
        "logprobs",
        "finish_reason",
        "extra",
    )

    def __init__(self, index: int, is_chat: bool) -> None:
        self.index, self.is_chat = index, is_chat
        self.texts: dict[str, list[str]] = {}  # the message's strings (chat), or the choice's text, in pieces
        self.fields: dict[str, Any] = {}  # the message's other fields, as last sent
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.function_call: dict[str, str] | None = None
        self.logprobs: dict[str, list] | None = None
        self.finish_reason: str | None = None
        self.extra: dict[str, Any] = {}  # choice-level fields an upstream adds (vLLM's stop_reason)

    def add(self, choice: dict[str, Any]) -> None:
        text = choice.get("text")
        if text is not None and type(text) is not str:
            raise TypeError("a choice's text")
        if self.is_chat:
            delta = choice.get("delta")
            if delta:
                texts = self.texts
                for key, value in delta.items():
                    if type(value) is str:
                        pieces = texts.get(key)
                        if pieces is None:
                            texts[key] = [value]
                        else:
                            pieces.append(value)
                    elif key == "tool_calls":
                        self._merge_tool_calls(value or ())
                    elif key == "function_call":
                        self._merge_function_call(value)
                    elif value is not None or key not in self.fields:
                        self.fields[key] = value
        else:
            self.texts.setdefault("text", []).append(text or "")
        logprobs = choice.get("logprobs")
        if logprobs:
            self._add_logprobs(logprobs)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            self.finish_reason = finish_reason
        if not _CHOICE_KEYS.issuperset(choice):
            self.extra |= {k: v for k, v in choice.items() if k not in _CHOICE_KEYS and v is not None}

    def _merge_tool_calls(self, deltas) -> None:
        for delta in deltas:
            call = self.tool_calls.setdefault(delta.get("index", len(self.tool_calls)), {"function": {}})
            for key, value in delta.items():
                if key == "function":
                    for name, piece in (value or {}).items():
                        _join(call["function"], name, piece)
                elif key != "index" and value is not None:
                    call[key] = value

    def _merge_function_call(self, delta: dict[str, Any] | None) -> None:
        self.function_call = self.function_call if self.function_call is not None else {}
        for key, piece in (delta or {}).items():
            _join(self.function_call, key, piece)

    def _add_logprobs(self, logprobs: dict[str, Any]) -> None:
        if self.logprobs is None:
            self.logprobs = {}
        for key, value in logprobs.items():
            if type(value) is list:
                self.logprobs.setdefault(key, []).extend(value)
        if not self.is_chat:
            for key in _COMPLETION_LOGPROBS:
                self.logprobs.setdefault(key, [])

    def answer(self) -> dict[str, Any]:
        texts = {key: "".join(pieces) for key, pieces in self.texts.items()}
        if not self.is_chat:
            text = texts.get("text", "")
            return {"index": self.index, "text": text, "logprobs": self.logprobs, "finish_reason": self.finish_reason}
        fields = self.fields | texts
        message = {"role": fields.get("role") or "assistant", "content": fields.get("content")}
        message |= {k: v for k, v in fields.items() if k not in message}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        if self.function_call is not None:
            message["function_call"] = self.function_call
        choice = {"index": self.index, "message": message, "logprobs": self.logprobs}
        return choice | {"finish_reason": self.finish_reason} | self.extra


def _join(into: dict[str, Any], key: str, value: Any) -> None:
    """Strings are pieces of one text; anything else replaces what came before (None never does)."""
    if value is None:
        into.setdefault(key, None)
    elif isinstance(value, str) and isinstance(into.get(key), str):
        into[key] += value
    else:
        into[key] = value


class AnswerAssembler:
    """Chunks in (`add`, or a whole stream's event payloads at once: `add_events`), one
    `CompletionResult` out (`result`). `model`: the name the answer carries in place of the
    upstream's (chunks that `add` takes were renamed already)."""

    def __init__(self, backend: str, model: str | None = None) -> None:
        self.backend = backend
        self.model = model
        self.first: dict[str, Any] | None = None
        self.last: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.usage: dict[str, Any] | None = None
        self.is_chat = False
        self.upstream_model: str | None = None
        self.num_chunks = 0  # without the upstream's usage, the answer is metered from this (a chunk a token)

    def add(self, chunk: StreamChunk) -> None:
        """Raises BackendError (502) for an error event and for a chunk not shaped like one."""
        if self.first is None:
            self.upstream_model = chunk.upstream_model
        self.add_event(chunk.parsed)

    def add_events(self, payloads: list[bytes]) -> None:
        """The JSON payloads of a stream's events, parsed in one pass (one call, not one a chunk)."""
        try:
            events = orjson.loads(b"[" + b",".join(payloads) + b"]")
        except orjson.JSONDecodeError:
            raise self._malformed("an event that is not JSON") from None
        if len(events) != len(payloads):  # a payload that held two values
            raise self._malformed("an event that is not one JSON object")
        if self.first is None and events and isinstance(events[0], dict):
            model = events[0].get("model")
            self.upstream_model = model if isinstance(model, str) else None
        for event in events:
            self.add_event(event)

    def add_event(self, data: Any) -> None:
        """One chunk, parsed; raises as `add` does."""
        if not isinstance(data, dict):
            raise self._malformed("a chunk that is not a JSON object")
        if data.get("error") is not None:
            self._fail(data["error"])
        if self.first is None:
            self.first, self.is_chat = data, str(data.get("object", "")).startswith("chat.")
        self.last = data
        choices, usage = data.get("choices"), data.get("usage")
        is_list = choices is None or isinstance(choices, list)
        if not is_list or not (usage is None or isinstance(usage, dict)):
            raise self._malformed("`choices` not a list, or `usage` not an object")
        if choices:
            by_index = self.choices
            try:
                for choice in choices:
                    index = choice.get("index", 0)
                    if type(index) is not int:
                        raise TypeError("a choice's index")
                    assembling = by_index.get(index)
                    if assembling is None:
                        assembling = by_index[index] = _Choice(index, self.is_chat)
                    assembling.add(choice)
            except (AttributeError, TypeError, ValueError) as exc:  # a field of the wrong type
                raise self._malformed(f"a choice not shaped like one ({type(exc).__name__})") from None
        if usage is not None:
            self.usage = usage
        self.num_chunks += 1

    def _malformed(self, what: str) -> BackendError:
        return BackendError(f"upstream {self.backend} sent {what} mid-answer", backend=self.backend)

    def _fail(self, error: Any) -> None:
        message = error.get("message") if isinstance(error, dict) else error
        raise BackendError(f"upstream {self.backend} sent an error mid-answer: {message}", backend=self.backend)

    def result(self) -> CompletionResult:
        if self.first is None:
            raise BackendError(f"upstream {self.backend} sent an empty stream", backend=self.backend)
        # the head is the first chunk's; a field only later chunks carry (system_fingerprint) is the last's
        head = {k: v for k, v in (self.last | self.first).items() if v is not None and k not in _NOT_HEAD}
        if self.model is not None and "model" in head:
            head["model"] = self.model
        body: dict[str, Any] = {
            "id": head.pop("id", ""),
            "object": "chat.completion" if self.is_chat else "text_completion",
            "created": head.pop("created", 0),
            "model": head.pop("model", ""),
            "choices": [self.choices[i].answer() for i in sorted(self.choices)],
        }
        if self.usage is not None:
            body["usage"] = self.usage
        return CompletionResult.from_dict(body | head, self.upstream_model)
