"""A client's score of one of its answers (`POST /v1/feedback`), stored on the request's learning
row: the shadowed request's own, else a feedback-only row with just the model that answered."""

from __future__ import annotations

from switchyard.billing.records import ANSWER_STATUSES, UsageRecord
from switchyard.billing.store import Database
from switchyard.billing.teams import Principal
from switchyard.core.errors import NotFound
from switchyard.gateway.services import Services
from switchyard.learning.rows import store_feedback


async def record_feedback(
    services: Services, database: Database, principal: Principal | None, request_id: str, score: float
) -> None:
    """NotFound unless the ledger holds `request_id` as an answered request of the caller's team."""
    team = principal.team.name if principal is not None else None
    records = await _records(services, database, request_id)
    answer = _answer(records)
    if answer is None or answer.team != team:  # another team's request is as unknown as none
        raise NotFound(f"No answered request '{request_id}' of your team is known.", param="request_id")
    outcome = {"cost_usd": answer.cost_usd, "output_tokens": answer.completion_tokens, "answered": True}
    created_at = min(record.started_at for record in records)
    await store_feedback(
        database, request_id, score, team=team, created_at=created_at, answered={answer.model: outcome}
    )
    services.metrics.shadow_requests.labels("feedback").inc()


async def _records(services: Services, database: Database, request_id: str) -> list[UsageRecord]:
    records = await database.read_usage(request_id=request_id)
    if not records and services.ledger is not None:  # answered a moment ago: still in the writer's buffer
        await services.ledger.flush()
        records = await database.read_usage(request_id=request_id)
    return [record for record in records if not record.is_shadow]


def _answer(records: list[UsageRecord]) -> UsageRecord | None:
    """The attempt whose answer the client got: its last completed one, else its last cancelled one."""
    for status in ANSWER_STATUSES:
        answers = [record for record in records if record.status == status]
        if answers:
            return max(answers, key=lambda record: record.attempt)
    return None
