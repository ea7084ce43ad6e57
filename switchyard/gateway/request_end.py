"""The one place a request ends, whoever served it (the HTTP layer or the batch tier): the request
count (`switchyard_requests_total` and the duration histograms), its refusal (the count by reason
and, for a known caller, its one ledger record) and the request log's line, all from values the
caller got back along the way (the caller, the parsed request, the relay's `Relayed`), never read
back from a response.
"""

from __future__ import annotations

import asyncio
import time

from switchyard.billing.metering import RequestMeter
from switchyard.billing.refusals import refusal_reason, refusal_record
from switchyard.core.errors import SwitchyardError
from switchyard.core.metrics import route_of
from switchyard.gateway.relay import Relayed
from switchyard.gateway.request_log import CLIENT_CLOSED_REQUEST, RequestLine, write_line
from switchyard.gateway.services import Services

AUTO_NAMES = ("auto", "cascade")


def end_exchange(
    services: Services,
    line: RequestLine,
    relayed: Relayed | None,
    status: int,
    started_at: float,
    *,
    refused: SwitchyardError | None = None,
) -> SwitchyardError | None:
    """The request is over: counted once, and its line written. `refused`: the error that ended it
    before the relay took it. Returns the refusal, when no model was called for it."""
    now = asyncio.get_running_loop().time()
    line.status = status
    refusal = relayed.refusal if relayed is not None else refused
    if relayed is not None:
        _count_relayed(services, line, relayed, now - relayed.started_at)
    else:
        count_refused(services, line.requested_model or "", status)
    if refusal is not None:
        services.metrics.refused(line.team, refusal_reason(refusal))
    if services.settings.logging.requests:
        write_line(line, now - started_at, services.settings.logging.format)
    return refusal


def meter_refusal(services: Services, line: RequestLine, refusal: SwitchyardError) -> None:
    """A known caller's refusal, in the ledger once (a caller without a valid key has no team)."""
    if services.ledger is None or line.team is None:
        return
    services.ledger.record(
        refusal_record(
            request_id=line.request_id,
            reason=refusal_reason(refusal),
            started_at=line.started_at,
            duration_ms=max(time.time() - line.started_at, 0.0) * 1000,
            team=line.team,
            key_id=line.key_id,
            requested_model=line.requested_model,
            client_request_id=line.client_request_id,
        )
    )


def _count_relayed(services: Services, line: RequestLine, relayed: Relayed, duration_s: float) -> None:
    registry, metrics = services.registry, services.metrics
    decision, answered, meter = relayed.decision, relayed.answered, relayed.meter
    requested = line.requested_model or ""
    if meter is not None:
        line.totals = meter.totals
        _count_seen(services, line, relayed, meter)
    if decision is not None:
        line.route = decision.headers.get("x-switchyard-route")
        cascade = answered.cascade if answered is not None else None
        line.cascade = cascade or decision.headers.get("x-switchyard-cascade")
    if answered is not None:
        model, backend = answered.entry.name, answered.deployment
        line.model, line.backend = model, backend
    elif decision is not None:
        model, backend = decision.entry.name, decision.entry.backend_kind
    else:  # refused before routing
        model, backend = model_label(services, requested), ""
    entry = registry.find(model)
    is_cascade = decision is not None and decision.plan is not None
    if decision is not None and answered is not None and answered.entry is not decision.entry and not is_cascade:
        metrics.fell_back(decision.entry.name, answered.entry.name)  # one of the routed model's fallbacks answered
    tier = (entry.tier or "") if entry is not None else ""
    if relayed.refusal is not None:  # no model was called: no duration
        metrics.request_refused(model=model, tier=tier, route=route_of(requested), status=relayed.status)
        return
    metrics.request_done(
        model=model, backend=backend, tier=tier, route=route_of(requested), status=relayed.status, duration_s=duration_s
    )
    if relayed.is_whole and not is_cascade and meter is not None and meter.upstream_s > 0:
        metrics.overhead.observe(max(duration_s - meter.upstream_s, 0.0))


def _count_seen(services: Services, line: RequestLine, relayed: Relayed, meter: RequestMeter) -> None:
    """The request as its client saw it, once it reached a model: routed requests counted by how
    they ended; time to the first and the last byte of its answer by route (a client's request
    only: a batch's line has none). A whole answer is one write, sent before this runs."""
    totals = meter.totals
    ttfb_s: float | None = None
    ttlb_s: float | None = None
    if totals.received_at is not None and relayed.status != CLIENT_CLOSED_REQUEST:
        ttlb_s = time.monotonic() - totals.received_at
        if relayed.is_whole:
            ttfb_s = ttlb_s
        elif totals.first_byte_at is not None:
            ttfb_s = totals.first_byte_at - totals.received_at
    line.ttfb_s = ttfb_s
    if meter.num_attempts > 0:
        services.metrics.request_seen(
            requested_model=line.requested_model or "", escalation=totals.escalation, ttfb_s=ttfb_s, ttlb_s=ttlb_s
        )
        routing = relayed.decision.routing if relayed.decision is not None else None
        if routing is not None:
            services.metrics.routing_version_requests.labels(routing.version, routing.role, totals.escalation).inc()


def model_label(services: Services, requested: str) -> str:
    """The `model` label for a request that named `requested` and was refused before a model was
    picked: that name if it is configured (or auto, cascade), else "" (never a client's free text)."""
    return requested if requested in AUTO_NAMES or services.registry.find(requested) is not None else ""


def count_refused(services: Services, requested: str, status: int) -> None:
    """A model request that ended before the relay took it: counted, with the labels the relay gives
    its own refusals; no backend, no duration (it never ran)."""
    entry = services.registry.find(requested)
    services.metrics.request_refused(
        model=model_label(services, requested),
        tier=(entry.tier or "") if entry is not None else "",
        route=route_of(requested),
        status=status,
    )
