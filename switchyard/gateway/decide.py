"""Where a request goes, decided before any call and before the first byte.

In this order: the caller's rate limits, then the route (`auto`), the cascade's first rung that
can serve the request (`cascade`) or the named model and its capabilities (`auto` and `cascade`
by the routing version `Routings.pick` gives the request, kept in the decision to its end), then saturation
admission, then the worst-case reservation in the caller's budgets, then the cascade's plan when
the admitted model is a rung. A request no model may serve is refused here, before any call: like
every refusal before a call, it is no attempt (its caller's refusal is one record of its own,
`switchyard.proxy.exchange`).
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.backends.base import AnyRequest
from switchyard.backends.registry import ModelEntry
from switchyard.billing.teams import Team
from switchyard.cascade.runtime import Plan
from switchyard.core.capabilities import unsupported
from switchyard.core.embeddings_wire import EmbeddingRequest
from switchyard.core.errors import InvalidRequest, ModelNotAllowed, RateLimitExceeded, wrong_kind
from switchyard.core.estimates import worst_case_tokens
from switchyard.core.request_context import RequestContext
from switchyard.gateway.auto_router import CASCADE_MODEL, auto_not_configured, cascade_not_configured
from switchyard.gateway.routings import VERSION_HEADER, Routing
from switchyard.gateway.services import Services


@dataclass(frozen=True, slots=True)
class Asked:
    """What the client asked of routing in its headers."""

    quality: str | None = None  # x-switchyard-quality
    cascade_mode: str | None = None  # x-switchyard-cascade
    priority: str | None = None  # how it meets a saturated model: its team's tier, else x-switchyard-priority
    refuses_cache: bool = False  # x-switchyard-cache: off, or Cache-Control: no-cache (switchyard.cache.policy)


@dataclass(slots=True)
class Decision:
    """Where a request goes, and why (the headers that explain it)."""

    entry: ModelEntry
    headers: dict[str, str]
    needed: dict[str, str]  # what the request needs of a model (`core.capabilities.needs`)
    plan: Plan | None = None  # the cascade's rungs, when the cascade answers
    score: float | None = None  # the classifier's (auto)
    ceiling: str | None = None  # the strongest model the route could have reached (auto, cascade)
    routing: Routing | None = None  # the routing version that decided it (auto, cascade)


def allowed(team: Team | None, entry: ModelEntry, asked_for: str) -> ModelEntry:
    if not entry.open_to(team):
        assert team is not None
        raise ModelNotAllowed(f"Team '{team.name}' may not use model '{asked_for}'.", param="model")
    return entry


def with_default_adapter(services: Services, team: Team | None, entry: ModelEntry) -> ModelEntry:
    """The team's default adapter on `entry`'s model, when it has one (`teams.*.default_adapters`)."""
    if team is None or not team.default_adapters:
        return entry
    for name in team.default_adapters:
        adapter = services.registry.find(name)
        if adapter is not None and adapter.parent == entry.name and adapter.open_to(team):
            return adapter
    return entry


async def decide(
    services: Services, parsed: AnyRequest, ctx: RequestContext, asked: Asked, needed: dict[str, str]
) -> Decision:
    principal, team = ctx.principal, ctx.team
    if isinstance(parsed, EmbeddingRequest):
        return await _decide_embedding(services, parsed, ctx, asked)
    headers = await _rate_headers(services, ctx, parsed)
    is_near = False
    score = ceiling = None
    routing = cascade = None
    if parsed.model == "auto":
        # Only "auto" routes by what is left; everything else is held to its reservation below.
        headroom = await services.budgets.headroom(principal)
        routing = services.routings.pick(ctx.request_id)  # kept to the end: a reload changes no request under way
        router, cascade = routing.auto_router, routing.cascade
        if router is None:
            raise auto_not_configured()
        decision = await router.route(parsed, asked.quality, team, headroom, needed)
        entry, score = decision.entry, decision.score
        ceiling = router.strongest(team).name
        headers["x-switchyard-route"] = decision.reason
        adapted = with_default_adapter(services, team, entry)
        if adapted is not entry:
            entry = adapted
            headers["x-switchyard-route"] += f"+adapter:{adapted.name}"
        if decision.score is not None:
            headers["x-switchyard-score"] = f"{decision.score:.4f}"
        margin = cascade.policy.hedge_margin if cascade is not None else None
        is_near = margin is not None and decision.margin is not None and decision.margin <= margin
    elif parsed.model == CASCADE_MODEL:
        routing = services.routings.pick(ctx.request_id)
        cascade = routing.cascade
        if cascade is None:
            raise cascade_not_configured()
        allowed(team, cascade.rungs[0].entry, CASCADE_MODEL)  # the cascade is the team's if its first rung is
        first, notes = cascade.first_capable(needed)
        entry = allowed(team, first, CASCADE_MODEL)
        headers["x-switchyard-route"] = f"cascade->{entry.name}" + "".join(notes)
    else:
        entry = allowed(team, services.registry.get(parsed.model), parsed.model)
        if entry.kind != "chat":
            raise wrong_kind(entry.name, entry.kind)
        lacking = entry.capabilities.lacks(needed)
        if lacking:
            raise unsupported(entry.name, lacking)
    if routing is not None:
        headers[VERSION_HEADER] = routing.version
    admission = await services.saturation.admit(entry, asked.priority, ctx, needed)
    if admission.is_degraded:
        headers["x-switchyard-degraded"] = "1"
    await _reserve(services, ctx, admission.entry, parsed)
    plan = None
    if cascade is not None:
        planned = cascade.plan(admission.entry, parsed, asked.cascade_mode, is_near, ctx, needed=needed)
        if isinstance(planned, str):
            headers["x-switchyard-cascade"] = planned
        elif planned is not None:  # None: admission degraded the request to a model that is no rung
            plan = planned
            if parsed.model == CASCADE_MODEL or ceiling is None:
                ceiling = plan.rungs[-1].entry.name
    if parsed.model == CASCADE_MODEL and ceiling is None:
        ceiling = admission.entry.name
    return Decision(admission.entry, headers, needed, plan, score, ceiling, routing)


async def _decide_embedding(
    services: Services, parsed: EmbeddingRequest, ctx: RequestContext, asked: Asked
) -> Decision:
    """Embeddings: the named embedding model (never `auto` or `cascade`), the caller's rate limits,
    saturation and the budget's reservation, as for a completion."""
    team = ctx.team
    if parsed.model in ("auto", CASCADE_MODEL):
        raise InvalidRequest(
            f"'{parsed.model}' chooses among chat models; /v1/embeddings needs an embedding model by name.",
            param="model",
            code="unsupported_model",
        )
    entry = allowed(team, services.registry.get(parsed.model), parsed.model)
    if entry.kind != "embedding":
        raise wrong_kind(entry.name, entry.kind)
    parsed.inputs()  # refused here when empty or too many, before anything is counted
    headers = await _rate_headers(services, ctx, parsed)
    admission = await services.saturation.admit(entry, asked.priority, ctx, {})
    await _reserve(services, ctx, admission.entry, parsed)
    return Decision(admission.entry, headers, {})


async def _rate_headers(services: Services, ctx: RequestContext, parsed: AnyRequest) -> dict[str, str]:
    """The caller's rate limits, checked (a 429 when over) and said in `x-ratelimit-*` headers."""
    try:
        rate = await services.budgets.check_rate(ctx.principal, worst_case_tokens(parsed))
    except RateLimitExceeded as exc:
        services.metrics.rate_limit_refused(ctx.team.name if ctx.team is not None else None, exc.limit)
        raise
    return rate.headers() if rate is not None else {}


async def _reserve(services: Services, ctx: RequestContext, entry: ModelEntry, parsed: AnyRequest) -> None:
    """The request's worst case reserved in the caller's budgets (a 429 when it does not fit)."""
    if not await ctx.meter.reserve_for(entry.name, parsed):
        cost = ctx.meter.worst_case_cost_usd(entry.name, parsed)
        raise await services.budgets.refusal(ctx.principal, (cost, entry.name))
