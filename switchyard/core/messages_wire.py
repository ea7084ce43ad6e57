"""Wire schemas of Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`),
in the order Anthropic's reference lists the fields, and its error body.

The request is read here and translated into a chat completion (`switchyard.gateway.messages`); the
answer is written back as a `Message`. Content blocks and tools stay plain objects here and are
checked block by block when translated, so that a block Switchyard cannot serve is a 400 naming it
(`messages[2].content[0].type`), not a schema error. Unknown fields are tolerated, as Anthropic's
API tolerates them.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from switchyard.core.chat_wire import WireRequest
from switchyard.core.errors import SwitchyardError

# Fields of a Messages request that only Anthropic's models read (Claude Code sends them all): a chat
# request translated from one keeps them for an Anthropic model through LiteLLM, and an
# OpenAI-compatible server is never sent them (OpenAI's refuses a field it does not know).
ANTHROPIC_ONLY_FIELDS = frozenset(("context_management", "output_config", "container", "mcp_servers"))


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class MessageParam(_Open):
    # "system": a turn of instructions among the messages (Claude Code sends its environment so)
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class RequestMetadata(_Open):
    user_id: str | None = None


class MessagesRequest(WireRequest):
    model: str
    messages: list[MessageParam]
    max_tokens: StrictInt = Field(ge=1)
    metadata: RequestMetadata | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    system: str | list[dict[str, Any]] | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    thinking: dict[str, Any] | None = None  # {"type": "enabled", "budget_tokens": N} | {"type": "disabled"}
    tool_choice: dict[str, Any] | None = None  # {"type": "auto" | "any" | "tool" | "none", ...}
    tools: list[dict[str, Any]] | None = None
    top_k: StrictInt | None = Field(default=None, ge=0)
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)


class CountTokensRequest(WireRequest):
    """What `/v1/messages/count_tokens` takes: a Messages request without `max_tokens`."""

    model: str
    messages: list[MessageParam]
    system: str | list[dict[str, Any]] | None = None
    thinking: dict[str, Any] | None = None
    tool_choice: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


# ---------------------------------------------------------------------------------------------
# The answer
# ---------------------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageUsage(_Open):
    input_tokens: int = 0  # not read from a cache nor written to one
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageObject(_Open):
    """`Message`: what `POST /v1/messages` answers, and what its stream's `message_start` carries."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[dict[str, Any]] = Field(default_factory=list)
    model: str
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage = Field(default_factory=MessageUsage)


class TokenCount(BaseModel):
    input_tokens: int


# ---------------------------------------------------------------------------------------------
# Errors: `{"type": "error", "error": {"type", "message"}}`
# ---------------------------------------------------------------------------------------------

OVERLOADED = 529  # Anthropic's status for "try again later": ours is 503
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}


def error_status(exc: SwitchyardError) -> int:
    """The status Anthropic would answer with: ours, but 529 for an overloaded or unready server."""
    return OVERLOADED if exc.status_code == 503 else exc.status_code


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(exc: SwitchyardError) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type(error_status(exc)), "message": exc.message}})
