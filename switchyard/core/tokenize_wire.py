"""Wire schemas of `POST /v1/tokenize` and `POST /v1/detokenize`: not OpenAI's (it has neither) but
vLLM's, whose servers answer both at their root, with Switchyard's fields under the banner.

A tokenize request holds a chat request's `messages` (with its `tools`, which chat templates
render) or a completion's `prompt`, and the answer counts the tokens the model would be given.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, Field, StrictInt

from switchyard.core.chat_wire import ChatMessage, WireRequest


class TokenizeRequest(WireRequest):
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    # --- Switchyard-only fields ---------------------------------------------------------------
    max_tokens: StrictInt | None = Field(default=None, ge=1)  # the answer's budget, for the cost range
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class DetokenizeRequest(WireRequest):
    model: str
    tokens: list[Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]]


class CostRange(BaseModel):
    """USD: the prompt alone (`min`), and the prompt with the longest answer it may get (`max`)."""

    min: float
    max: float


class TokenizeResponse(BaseModel):
    model: str
    count: int
    max_model_len: int | None  # the context window, null when unknown
    tokens: list[int] | None = None
    # --- Switchyard-only fields ---------------------------------------------------------------
    estimated_cost_usd: CostRange | None = None
    approximate: bool = False
    tokenizer: str | None = None  # the stand-in an approximate count (or an OpenAI model's) used
    routed_to: str | None = None  # the model `auto` or `cascade` would answer with

    def to_json(self) -> bytes:
        """The answer: optional fields only when set; `max_model_len` always, null when unknown."""
        body: dict[str, Any] = {"model": self.model, "count": self.count, "max_model_len": self.max_model_len}
        if self.tokens is not None:
            body["tokens"] = self.tokens
        if self.estimated_cost_usd is not None:
            body["estimated_cost_usd"] = self.estimated_cost_usd.model_dump()
        body["approximate"] = self.approximate
        for name in ("tokenizer", "routed_to"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return orjson.dumps(body)


class DetokenizeResponse(BaseModel):
    model: str
    prompt: str
