"""Wire schemas of the OpenAI-compatible API, in the order OpenAI's reference lists the fields.

Requests allow unknown fields (`extra="allow"`): a client field Switchyard does not know yet is
forwarded to the backend untouched. The fields it knows have strict types, as OpenAI's API has:
the body is forwarded as the client sent it, so a `"10"` that validation coerced into a number
would still reach the upstream as a string. An integer is a valid number (`temperature: 1`).
Fields that exist only in Switchyard sit under the banner at the end of this module.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, Tag


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class WireRequest(_Open):
    """A request body that remembers the JSON object it was validated from.

    Backends forward `wire_payload()` (the client's own fields, unknown ones included) instead of
    re-serialising the model: it is exactly what the client sent, and cheaper.
    """

    _payload: dict[str, Any] | None = PrivateAttr(default=None)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        request = cls.model_validate(payload)
        request._payload = payload
        return request

    @property
    def payload(self) -> dict[str, Any] | None:
        """The JSON object this request was validated from (not to be changed), None if it was
        built otherwise. Read from pydantic's private store directly: `self._payload` would go
        through `BaseModel.__getattr__` on every read."""
        payload: dict[str, Any] | None = self.__pydantic_private__["_payload"]  # type: ignore[index]
        return payload

    def set_field(self, name: str, value: Any) -> None:
        """Set a field on the model and in the body sent upstream (a cap the proxy applies)."""
        setattr(self, name, value)
        if self.payload is not None:
            self._payload = {**self.payload, name: value}

    def wire_payload(self) -> dict[str, Any]:
        """A shallow copy of the body to send upstream."""
        payload = self.payload
        if payload is not None:
            return dict(payload)
        return self.model_dump(exclude_unset=True)


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


def message_text(content: str | list[dict[str, Any]] | None) -> str:
    """The text of a message's content: the string itself, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


class ChatCompletionRequest(WireRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, StrictFloat] | None = None
    logprobs: StrictBool | None = None
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    n: StrictInt | None = Field(default=None, ge=1, le=128)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    response_format: dict[str, Any] | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0)
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    user: str | None = None


def _prompt_kind(value: Any) -> str:
    """Which form a prompt takes, read from its first item, so that one form alone is validated
    (a smart union would try every form, and fail 500,000 token ids as strings first)."""
    if not isinstance(value, list):
        return "str"
    first = value[0] if value else ""
    if isinstance(first, list):
        return "list[list[int]]"
    return "list[int]" if isinstance(first, int) and not isinstance(first, bool) else "list[str]"


Prompt = Annotated[
    Annotated[str, Tag("str")]
    | Annotated[list[str], Tag("list[str]")]
    | Annotated[list[StrictInt], Tag("list[int]")]
    | Annotated[list[list[StrictInt]], Tag("list[list[int]]")],
    Discriminator(_prompt_kind),
]


class CompletionRequest(WireRequest):
    model: str
    prompt: Prompt
    echo: StrictBool | None = None
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, StrictFloat] | None = None
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    n: StrictInt | None = Field(default=None, ge=1, le=128)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2.0, le=2.0)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    user: str | None = None


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------


class Usage(_Open):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class TopLogprob(_Open):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Open):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Open):
    content: list[TokenLogprob] | None = None


class AssistantMessage(_Open):
    role: str = "assistant"
    content: str | None = None


class ChatChoice(_Open):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(_Open):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(_Open):
    index: int = 0
    text: str = ""
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class Completion(_Open):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(_Open):
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "switchyard"
    # --- Switchyard-only fields ---------------------------------------------------------------
    kind: str = "chat"  # chat | embedding (what /v1/embeddings serves)
    parent: str | None = None  # a LoRA adapter's base model (vLLM's name for it)
    tier: str | None = None
    context_window: int | None = None
    ready: bool = False
    # what the model can do (core.capabilities.Capabilities.as_dict()): tools, vision, ..., context_window
    capabilities: dict[str, bool | int | None] = Field(default_factory=dict)
    tiers: dict[str, list[str]] | None = None  # `auto`: each tier and its models, lowest tier first
    ladder: list[str] | None = None  # `cascade`: its rungs, cheapest first
    # `auto`, `cascade`: the routing version of each role (current, and candidate during a rollout)
    routing_versions: dict[str, str] | None = None
    rollout_share: float | None = None  # the candidate's share of requests, during a rollout


class ModelList(_Open):
    object: str = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------------------------------------
# Switchyard-only
# ---------------------------------------------------------------------------------------------


_MODEL_FIELD = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*"|null)')


def _model_span(data: bytes, at: int) -> tuple[int, int] | None:
    """Where the value (a string or null) of the `"model"` key first found at `at` is in `data`.
    A compact `"model":"name"` without escapes (what upstreams send) needs one `find`; anything
    else (spaces, escapes, null) the regex, from `at`: no `"model"` comes before it."""
    if data.startswith(b'"model":"', at):
        start = at + 8
        end = data.find(b'"', start + 1) + 1
        if end > 0 and b"\\" not in data[start:end]:
            return start, end
    found = _MODEL_FIELD.search(data, at)
    return found.span(1) if found is not None else None


@functools.lru_cache(maxsize=64)
def _json_string(name: str) -> bytes:
    return orjson.dumps(name)


@functools.lru_cache(maxsize=64)
def _model_member(name: str) -> bytes:
    """`"model":"name"` as a compact object spells it (the closing quote included)."""
    return b'"model":' + orjson.dumps(name)


@functools.lru_cache(maxsize=256)
def _decoded(raw: bytes) -> str | None:
    """A JSON string's (or null's) bytes, decoded; the same few upstream names come every time."""
    decoded: str | None = orjson.loads(raw)
    return decoded


class RawJSON:
    """A JSON object an upstream sent, kept as its bytes; `parsed` decodes on first use and caches.

    Relaying needs no parsing: the bytes go to the client as they came unless something changed
    them. Cascade confidence and metering read `parsed`. `upstream_model` is the name the upstream
    gave its model, once `named()` has put the configured name in its place.
    """

    __slots__ = ("data", "_parsed", "upstream_model")

    def __init__(self, data: bytes, parsed: dict[str, Any] | None = None, upstream_model: str | None = None) -> None:
        self.data = data
        self._parsed = parsed
        self.upstream_model = upstream_model

    @classmethod
    def from_dict(cls, payload: dict[str, Any], upstream_model: str | None = None) -> Self:
        return cls(orjson.dumps(payload), payload, upstream_model)

    def named(self, model: str) -> Self:
        """This object with `model` set to `model` (the configured name a client can send again) and
        the upstream's own name kept in `upstream_model`. The bytes are searched, not parsed: the
        first `"model"` key is the top-level one in OpenAI's objects (a string's quotes are escaped),
        and they change only when the name differs. An upstream sends the same name in every chunk:
        its bytes are decoded once, not per chunk."""
        at = self.data.find(b'"model"')
        if at == -1:  # no model (an error event): nothing to rename
            return self
        if self.data.startswith(_model_member(model), at):  # the upstream uses our name
            self.upstream_model = model
            return self
        span = _model_span(self.data, at)
        if span is None:
            return self
        start, end = span
        raw, encoded = self.data[start:end], _json_string(model)
        upstream = model if raw == encoded else _decoded(raw)
        if upstream == model:
            self.upstream_model = upstream
            return self
        data = self.data[:start] + encoded + self.data[end:]
        parsed = {**self._parsed, "model": model} if self._parsed is not None else None
        return type(self)(data, parsed, upstream)

    @property
    def parsed(self) -> dict[str, Any]:
        if self._parsed is None:
            self._parsed = orjson.loads(self.data)
        return self._parsed

    @property
    def has_usage(self) -> bool:
        return b'"usage"' in self.data and self.parsed.get("usage") is not None

    @property
    def has_choices(self) -> bool:
        return b'"choices"' in self.data and bool(self.parsed.get("choices"))


class StreamChunk(RawJSON):
    """One event of an upstream stream (a `ChatCompletionChunk` or a completions chunk)."""

    __slots__ = ()

    def text(self) -> str:
        """The text this chunk adds (chat `delta.content` or completions `text`)."""
        parts = []
        for choice in self.parsed.get("choices") or ():
            delta = choice.get("delta")
            piece = delta.get("content") if delta else choice.get("text")
            if piece:
                parts.append(piece)
        return "".join(parts)


class CompletionResult(RawJSON):
    """A whole non-stream answer (`ChatCompletion` or `Completion`), validated on demand."""

    __slots__ = ()

    def looks_like_completion(self) -> bool:
        """A structural check that costs no parse: a JSON object with `choices`.

        A full parse of a logprobs answer is the largest cost on the relay path, and nothing
        needs it unless a caller reads `parsed`.
        """
        data = self.data.strip()
        return data.startswith(b"{") and data.endswith(b"}") and b'"choices"' in data

    def looks_like_embeddings(self) -> bool:
        """The same check for an embeddings answer: a JSON object with `data`."""
        data = self.data.strip()
        return data.startswith(b"{") and data.endswith(b"}") and b'"data"' in data

    def as_chat_completion(self) -> ChatCompletion:
        return ChatCompletion.model_validate(self.parsed)
