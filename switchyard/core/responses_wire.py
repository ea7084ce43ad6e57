"""Wire schemas of OpenAI's Responses API (`POST /v1/responses`), stateless, in the reference's order.

The request is read here and translated into a chat completion (`switchyard.gateway.responses`); the
answer is written back in the `Response` shape below. `input` items and `tools` stay plain objects
here and are checked item by item when translated, so that an item Switchyard cannot serve is a 400
naming it (`input[2].type`), not a schema error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from switchyard.core.chat_wire import WireRequest


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextConfig(_Open):
    format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Open):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(WireRequest):
    model: str
    input: str | list[dict[str, Any]]
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    parallel_tool_calls: StrictBool | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0.0, le=2.0)
    text: TextConfig | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None


# ---------------------------------------------------------------------------------------------
# The answer
# ---------------------------------------------------------------------------------------------


class ResponseUsage(_Open):
    input_tokens: int = 0
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens: int = 0
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int = 0


class IncompleteDetails(_Open):
    reason: str


class ResponseObject(_Open):
    """`Response`: what `POST /v1/responses` answers, and what its stream's lifecycle events carry."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[dict[str, Any]] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    reasoning: dict[str, Any] | None = None
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
