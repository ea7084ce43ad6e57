"""From attempts back to client requests: how each request was routed and what it came to.

The ledger holds one record per attempt; the route mix, the escalation rate and the savings are
about requests. Records arrive ordered by `started_at`, and every attempt of a request starts
within its deadline, so a request unseen for `horizon_s` of stream time is complete: it is
classified and dropped. Memory holds the requests of the last hour, not the whole period.

Classification of one request (shadow calls never answer the client and are left out):

- kind: what the client asked for (`requested_model`): `auto`, `cascade`, or a model name
  (`direct`); rows written before the field existed fall back on the route (`auto:…`,
  `cascade…`), else `unrecorded`;
- its answer: its last completed attempt, else its last one cancelled (the client left;
  `is_answer`); the request escalated when a rung other than its first answered it (the answer
  climbed from a rung below: `escalation_outcome`, the rule `/metrics` counts by too), failed when
  nothing answered;
- route label: `auto:<tier>` (the tier the route names, else the tier of the first model tried),
  `auto:<tier>→<tier>` when it escalated (to the tier, else the model, of its answer),
  `cascade:accepted` / `cascade:escalated` / `cascade:failed`, `direct`, `unrecorded`;
- outcome, exactly one: `failed` (no attempt completed or was cancelled by the client), else
  `degraded` (a route containing "degraded"), else `fallback` (a route naming a fallback, or a
  failed attempt on a model other than the one that answered), else `as_routed`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date

from switchyard.billing.records import ROUTED_ENTRY_POINTS, UsageRecord, escalation_outcome, is_answer

REQUEST_HORIZON_S = 3600.0
OUTCOMES = ("as_routed", "fallback", "degraded", "failed")
ROUTED_KINDS = ROUTED_ENTRY_POINTS
_TIER = re.compile(r"\s*([\w.-]+)")


def request_kind(requested_model: str | None, route: str | None) -> str:
    if requested_model in ROUTED_KINDS:
        return requested_model
    if requested_model:
        return "direct"
    if route and route.startswith("auto"):
        return "auto"
    if route and route.startswith("cascade"):
        return "cascade"
    return "unrecorded"


def tier_in_route(route: str | None) -> str | None:
    """`auto:classifier=0.31<0.45->small(large over budget)` → `small`."""
    if not route or "->" not in route:
        return None
    match = _TIER.match(route.rsplit("->", 1)[1])
    return match.group(1) if match else None


@dataclass(slots=True)
class RequestTrace:
    """What the report keeps of one request while its attempts arrive."""

    request_id: str
    day: date
    team: str
    first_started_at: float
    last_started_at: float
    kind: str = "unrecorded"
    num_attempts: int = 0  # shadow calls left out
    is_degraded: bool = False
    is_fallback_route: bool = False
    failed_models: set[str] = field(default_factory=set)
    first_attempt: int = 0
    first_tier: str | None = None  # the tier of the first model tried
    answer_attempt: int = 0
    answer_model: str | None = None
    answer_status: str | None = None
    answer_tier: str | None = None
    answer_escalated_from: str | None = None  # the rung the answer climbed from
    first_escalated_attempt: int = 0  # the first answer judged and dropped, and why
    first_escalated_reason: str | None = None
    # as the client saw it (on the attempt whose answer was sent), and that attempt's own duration
    client_ttfb_ms: float | None = None
    client_duration_ms: float | None = None
    sent_attempt_ms: float | None = None
    route_tier: str | None = None
    cost_usd: float = 0.0  # every attempt that was not a shadow call
    ceiling_cost_usd: float = 0.0  # completed attempts on the strongest model the route could reach
    num_without_ceiling: int = 0  # completed attempts with no ceiling recorded (counted at their own cost)
    routing_version: str | None = None  # the routing version that routed it (auto, cascade)
    answer_cost_usd: float | None = None  # the answer's own cost, and the strongest model's for its tokens
    answer_ceiling_usd: float | None = None

    def add(self, record: UsageRecord, day: date) -> None:
        if record.started_at < self.first_started_at:
            self.first_started_at, self.day = record.started_at, day
        self.last_started_at = max(self.last_started_at, record.started_at)
        if record.is_shadow:
            return
        self.num_attempts += 1
        if self.kind == "unrecorded":
            self.kind = request_kind(record.requested_model, record.route)
        route = (record.route or "").lower()
        self.is_degraded |= "degraded" in route
        self.is_fallback_route |= "fallback" in route
        self.route_tier = self.route_tier or tier_in_route(record.route)
        self.cost_usd += record.cost_usd
        self.routing_version = self.routing_version or record.routing_version
        if self.first_attempt == 0 or record.attempt < self.first_attempt:
            self.first_attempt, self.first_tier = record.attempt, record.tier
        if record.status == "escalated":
            if self.first_escalated_attempt == 0 or record.attempt < self.first_escalated_attempt:
                self.first_escalated_attempt, self.first_escalated_reason = record.attempt, record.error
        elif record.status == "failed":
            self.failed_models.add(record.model)
        elif is_answer(record.status, record.attempt, self.answer_status, self.answer_attempt):
            self.answer_attempt, self.answer_model, self.answer_status = record.attempt, record.model, record.status
            self.answer_tier, self.answer_escalated_from = record.tier, record.escalated_from
            self.answer_cost_usd, self.answer_ceiling_usd = record.cost_usd, record.ceiling_cost_usd
        if record.request_duration_ms is not None:
            self.client_ttfb_ms, self.client_duration_ms = record.request_ttfb_ms, record.request_duration_ms
            self.sent_attempt_ms = record.duration_ms
        if record.status == "completed":
            if record.ceiling_cost_usd is None:
                self.ceiling_cost_usd += record.cost_usd
                self.num_without_ceiling += 1
            else:
                self.ceiling_cost_usd += record.ceiling_cost_usd

    @property
    def escalation(self) -> str:
        """accepted | escalated | failed (`switchyard.billing.records.escalation_outcome`)."""
        return escalation_outcome(self.answer_model, self.answer_escalated_from)

    @property
    def escalation_reason(self) -> str | None:
        """Why an escalated request left its first rung: the reason of the first answer judged and
        dropped (`low-confidence`, `no-logprobs`…), else `error` (a rung below failed), else `hedge`
        (the hedge answered first); None when it did not escalate."""
        if self.escalation != "escalated":
            return None
        if self.first_escalated_attempt:
            return self.first_escalated_reason or "unspecified"
        return "error" if self.failed_models else "hedge"

    @property
    def route_label(self) -> str:
        if self.kind == "auto":
            label = "auto:" + (self.route_tier or self.first_tier or "unknown")
            if self.escalation == "escalated":
                label += "→" + (self.answer_tier or self.answer_model or "unknown")
            return label
        if self.kind == "cascade":
            return "cascade:" + self.escalation
        return self.kind

    @property
    def outcome(self) -> str:
        if self.answer_model is None:
            return "failed"
        if self.is_degraded:
            return "degraded"
        if self.is_fallback_route or self.failed_models - {self.answer_model}:
            return "fallback"
        return "as_routed"


class RequestTracker:
    """Joins attempts into requests; hands each finished request to `on_request`."""

    def __init__(self, on_request: Callable[[RequestTrace], None], horizon_s: float = REQUEST_HORIZON_S) -> None:
        self._on_request = on_request
        self._horizon_s = horizon_s
        self._open: OrderedDict[str, RequestTrace] = OrderedDict()

    @property
    def num_open(self) -> int:
        return len(self._open)

    def add(self, record: UsageRecord, day: date, team: str) -> None:
        trace = self._open.get(record.request_id)
        if trace is None:
            trace = RequestTrace(record.request_id, day, team, record.started_at, record.started_at)
            self._open[record.request_id] = trace
        else:
            self._open.move_to_end(record.request_id)
        trace.add(record, day)
        self._close_older_than(record.started_at - self._horizon_s)

    def finish(self) -> None:
        self._close_older_than(float("inf"))

    def _close_older_than(self, cutoff: float) -> None:
        while self._open:
            oldest = next(iter(self._open.values()))
            if oldest.last_started_at >= cutoff:
                return
            del self._open[oldest.request_id]
            self._on_request(oldest)
