"""One usage record per attempt at a backend: the row the ledger writes and the reports read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str  # the proxy's own id for the request (never the client's)
    attempt: int  # 1, 2, … in the order the attempts ended; (request_id, attempt) is the key
    model: str  # the public model name that was tried
    backend: str  # the deployment that took it
    status: str  # completed | cancelled | failed | escalated (judged by the cascade, not sent)
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    is_estimated: bool  # token counts estimated (no usage from the upstream)
    started_at: float  # unix seconds
    duration_ms: float
    error: str | None = None
    team: str | None = None  # the calling team, when teams are configured
    # What the reports need (all optional: an offline run or an old row has none of them).
    client_request_id: str | None = None  # the client's x-request-id, for correlation only
    key_id: str | None = None  # key_…
    requested_model: str | None = None  # what the client asked for: auto, cascade or a name
    tier: str | None = None  # the model's tier
    route: str | None = None  # x-switchyard-route: why this model
    score: float | None = None  # the classifier's score (auto)
    escalated_from: str | None = None  # the cascade rung this attempt climbed from
    ttft_ms: float | None = None  # time to the first token (streams, and whole answers assembled from one)
    is_hedge: bool = False  # started beside another attempt (a cascade hedge)
    is_shadow: bool = False  # a shadow call, never answered the client
    hosting: str | None = None  # self-hosted | commercial
    ceiling_cost_usd: float | None = None  # these tokens on the strongest model the route could reach
    batch_id: str | None = None  # the batch whose line this request answered (the batch tier)
