"""`POST /v1/feedback`'s body: a client's score of one of its answers."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field


class FeedbackCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)  # the proxy's x-request-id of the answer
    score: float = Field(ge=0, le=1, allow_inf_nan=False)  # 0: useless … 1: just right

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        return cls.model_validate(payload)
