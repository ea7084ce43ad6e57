"""One usage record per attempt at a backend (and one per refused request): the row the ledger
writes and the reports read."""

from __future__ import annotations

from dataclasses import dataclass

# A request answered with an error before any model was called (a budget, a rate limit, an invalid
# body...): one record, attempt 0, no model, backend, tokens or cost, its reason in `error`.
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str  # the proxy's own id for the request (never the client's)
    attempt: int  # 1, 2, … in the order the attempts ended (0: refused); (request_id, attempt) is the key
    model: str  # the public model name that was tried
    backend: str  # the deployment that took it
    status: str  # completed | cancelled | failed | escalated (judged by the cascade, not sent) | refused
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
    # A rung the cascade judged: its answer's confidence (None: no logprobs) and the threshold it had to reach.
    confidence: float | None = None
    threshold: float | None = None
    # The request as its client saw it, on the attempt whose answer the proxy sent (its first body
    # byte and its end, from the request's arrival); None on every other attempt and on old rows.
    request_ttfb_ms: float | None = None
    request_duration_ms: float | None = None
    routing_version: str | None = None  # the routing version that routed the request (auto, cascade)
    # Of prompt_tokens, those the upstream read from its prompt cache and those it wrote to it
    # (None: the upstream's usage was not at hand, or an old row).
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    # The response cache (docs/cache.md), on the record of the answer the client got: hit | miss |
    # bypass (None: the cache had nothing to do with the request). A hit's record has no tokens of
    # its own; it keeps what answering again would have used and cost.
    response_cache: str | None = None
    response_cache_saved_tokens: int | None = None
    response_cache_saved_usd: float | None = None


# An attempt whose answer went to the client: completed, or cut short by the client leaving.
ANSWER_STATUSES = ("completed", "cancelled")
ROUTED_ENTRY_POINTS = ("auto", "cascade")  # the `model` names that route a request
ESCALATION_OUTCOMES = ("accepted", "escalated", "failed")


def is_answer(status: str, attempt: int, answer_status: str | None, answer_attempt: int) -> bool:
    """Whether attempt number `attempt` of a request is its answer rather than the one found so far
    (`answer_status` None: none yet): its last completed attempt, else its last cancelled one (a
    hedge's loser, cancelled whenever it is, never outranks the answer that won)."""
    if status not in ANSWER_STATUSES:
        return False
    if answer_status is not None and (status == "completed") != (answer_status == "completed"):
        return status == "completed"
    return answer_status is None or attempt > answer_attempt


def escalation_outcome(answer: str | None, answer_escalated_from: str | None) -> str:
    """How a routed request ended, by its answer (`is_answer`; `answer`: that attempt's model, None
    when there is none; `answer_escalated_from`: the rung it climbed from). `escalated` when a
    rung other than the request's first answered it (a low-confidence or failed rung below, or a
    hedge that answered first), `accepted` when its first rung (or the model it was routed to)
    did, `failed` when nothing did."""
    if answer is None:
        return "failed"
    return "escalated" if answer_escalated_from is not None else "accepted"
