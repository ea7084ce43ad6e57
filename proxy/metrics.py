"""What `/metrics` reads at scrape time: the gauges that describe the present (readiness,
saturation, breakers, in-flight, queues, budgets) and the counters other objects keep (shed,
attempts, the cascade's verdicts). `LiveGauges` is registered in the app's own registry beside
the counters and histograms of `switchyard.core.metrics`."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from switchyard.billing.limits import LimitsUnavailable
from switchyard.proxy.saturation import is_saturated

BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}

__all__ = ["CONTENT_TYPE_LATEST", "LiveGauges", "exposition"]


async def exposition(services) -> bytes:
    """The text of one scrape; the budgets are read first (a shared limiter is awaited)."""
    try:
        services.metrics.budget_used_ratio = await services.budgets.used_ratios(services.directory.teams.values())
    except LimitsUnavailable:
        services.metrics.budget_used_ratio = {}  # Valkey is down: no value rather than a stale one
    return generate_latest(services.metrics.registry)


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=list(labels))


def _counter(name: str, help_text: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, labels=list(labels))


class LiveGauges(Collector):
    def __init__(self, services) -> None:
        self.services = services

    def describe(self) -> list:
        return []  # nothing to check at registration: the names are the collector's own

    def collect(self) -> Iterator:
        state = self.services
        entries = list(state.registry)
        guards = {entry.name: state.executor.guard(entry) for entry in entries}
        ready = _gauge("switchyard_model_ready", "1 when the model's backend passed its last health probe.", ("model",))
        saturated = _gauge("switchyard_model_saturated", "1 when the model's backend reports saturation.", ("model",))
        for e in entries:
            ready.add_metric([e.name], float(e.backend.is_ready()))
            saturated.add_metric([e.name], float(is_saturated(e)))
        yield ready
        yield saturated
        breaker = _gauge("switchyard_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.", ("model",))
        in_flight = _gauge("switchyard_in_flight", "Requests in flight at the model.", ("model",))
        shed = _counter("switchyard_shed", "Requests turned away by load shedding.", ("model",))
        for name, guard in guards.items():
            breaker.add_metric([name], BREAKER_STATES[guard.breaker_state])
            in_flight.add_metric([name], guard.num_in_flight)
            shed.add_metric([name], guard.num_shed)
        replica = _gauge(
            "switchyard_replica_breaker_state",
            "Circuit breaker of each replica of a model with several: 0 closed, 1 half-open, 2 open.",
            ("model", "replica"),
        )
        for model, replicas in state.executor.replica_states().items():
            for name, value in replicas.items():
                replica.add_metric([model, name], BREAKER_STATES[value])
        yield from (breaker, replica, in_flight, shed)
        attempts = _counter("switchyard_attempts", "Attempts at a backend, by outcome.", ("model", "status"))
        for (model, status), n in sorted(state.attempt_counts.items()):
            attempts.add_metric([model, status], n)
        yield attempts
        degraded = _counter("switchyard_degraded", "Best-effort requests sent to a smaller model.")
        degraded.add_metric([], state.saturation.num_degraded)
        waiting = _gauge("switchyard_priority_waiting", "Priority requests waiting out saturation.")
        waiting.add_metric([], state.saturation.num_waiting)
        yield degraded
        yield waiting
        metrics = state.metrics
        queue = _gauge(
            "switchyard_queue_depth_tokens",
            "Tokens (prompt estimate plus max_tokens or its default) waiting for a first token at the model: "
            "the embedded engine's own queue; for other backends, what this proxy sent that has no first token yet.",
            ("model",),
        )
        for e in entries:
            queued_tokens = getattr(e.backend, "queued_tokens", None)  # the embedded engine knows its own
            queue.add_metric(
                [e.name], queued_tokens() if queued_tokens is not None else state.executor.waiting.of(e.name)
            )
        budget = _gauge("switchyard_budget_used_ratio", "Share of the team's tightest budget spent.", ("team",))
        for team, ratio in sorted(metrics.budget_used_ratio.items()):
            budget.add_metric([team], ratio)
        yield queue
        yield budget
        scorer = state.auto_router.scorer if state.auto_router is not None else None
        if scorer is not None:
            batches = _counter("switchyard_classifier_batches", "Classifier forward passes.")
            batches.add_metric([], scorer.num_batches)
            scored = _counter("switchyard_classifier_scored", "Prompts scored (cache misses).")
            scored.add_metric([], scorer.num_scored)
            yield batches
            yield scored
        if state.cascade is not None:
            yield from _cascade_families(state.cascade)


def _cascade_families(cascade) -> Iterator:
    guard = cascade.guard
    routes = cascade.names[:-1]
    cooling = set(guard.cooling_routes())
    judged = _counter(
        "switchyard_cascade_judged",
        "Answers the cascade judged, by verdict (accepted, escalated, no-logprobs, error).",
        ("model", "verdict"),
    )
    for (model, verdict), n in sorted(cascade.judged.items()):
        judged.add_metric([model, verdict], n)
    trips = _counter(
        "switchyard_cascade_thrash_trips",
        "Times a route's escalation rate passed the limit and it started one rung higher.",
        ("route",),
    )
    active = _gauge(
        "switchyard_cascade_thrash_active", "1 while the thrash guard starts the route one rung higher.", ("route",)
    )
    moved = _counter("switchyard_cascade_moved_up", "Requests the thrash guard started one rung higher.", ("route",))
    for route in routes:
        trips.add_metric([route], guard.trips[route])
        active.add_metric([route], float(route in cooling))
        moved.add_metric([route], cascade.moved_up[route])
    hedges = _counter(
        "switchyard_cascade_hedge_wins", "Hedged requests, by the rung whose answer was used.", ("model",)
    )
    for model, n in sorted(cascade.hedges.items()):
        hedges.add_metric([model], n)
    yield from (judged, trips, active, moved, hedges)
