"""`GET /metrics`: Prometheus text format, written by hand (a handful of gauges and counters)."""

from collections.abc import Iterable

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from switchyard.proxy.openapi import NO_KEY
from switchyard.proxy.saturation import is_saturated

router = APIRouter()

BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}


def _metric(name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{label_text}}} {value:g}" if label_text else f"{name} {value:g}")
    return lines


@router.get("/metrics", response_class=PlainTextResponse, openapi_extra=NO_KEY)
async def metrics(request: Request) -> Response:
    state = request.app.state.services
    entries = list(state.registry)
    guards = {entry.name: state.executor.guard(entry) for entry in entries}
    lines: list[str] = []
    lines += _metric(
        "switchyard_model_ready",
        "gauge",
        "1 when the model's backend passed its last health probe.",
        (({"model": e.name}, float(e.backend.is_ready())) for e in entries),
    )
    lines += _metric(
        "switchyard_model_saturated",
        "gauge",
        "1 when the model's backend reports saturation.",
        (({"model": e.name}, float(is_saturated(e))) for e in entries),
    )
    lines += _metric(
        "switchyard_breaker_state",
        "gauge",
        "Circuit breaker: 0 closed, 1 half-open, 2 open.",
        (({"model": n}, BREAKER_STATES[g.breaker_state]) for n, g in guards.items()),
    )
    lines += _metric(
        "switchyard_replica_breaker_state",
        "gauge",
        "Circuit breaker of each replica of a model with several: 0 closed, 1 half-open, 2 open.",
        (
            ({"model": m, "replica": r}, BREAKER_STATES[s])
            for m, replicas in state.executor.replica_states().items()
            for r, s in replicas.items()
        ),
    )
    lines += _metric(
        "switchyard_in_flight",
        "gauge",
        "Requests in flight at the model.",
        (({"model": n}, g.num_in_flight) for n, g in guards.items()),
    )
    lines += _metric(
        "switchyard_shed_total",
        "counter",
        "Requests turned away by load shedding.",
        (({"model": n}, g.num_shed) for n, g in guards.items()),
    )
    lines += _metric(
        "switchyard_attempts_total",
        "counter",
        "Attempts at a backend, by outcome.",
        (({"model": m, "status": s}, n) for (m, s), n in sorted(state.attempt_counts.items())),
    )
    lines += _metric(
        "switchyard_degraded_total",
        "counter",
        "Best-effort requests sent to a smaller model.",
        [({}, state.saturation.num_degraded)],
    )
    lines += _metric(
        "switchyard_priority_waiting",
        "gauge",
        "Priority requests waiting out saturation.",
        [({}, state.saturation.num_waiting)],
    )
    scorer = state.auto_router.scorer if state.auto_router is not None else None
    if scorer is not None:
        lines += _metric(
            "switchyard_classifier_batches_total", "counter", "Classifier forward passes.", [({}, scorer.num_batches)]
        )
        lines += _metric(
            "switchyard_classifier_scored_total", "counter", "Prompts scored (cache misses).", [({}, scorer.num_scored)]
        )
    if state.cascade is not None:
        lines += _cascade_metrics(state.cascade)
    return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _cascade_metrics(cascade) -> list[str]:
    guard = cascade.guard
    routes = cascade.names[:-1]
    cooling = set(guard.cooling_routes())
    lines = _metric(
        "switchyard_cascade_judged_total",
        "counter",
        "Answers the cascade judged, by verdict (accepted, escalated, no-logprobs, error).",
        (({"model": m, "verdict": v}, n) for (m, v), n in sorted(cascade.judged.items())),
    )
    lines += _metric(
        "switchyard_cascade_thrash_trips_total",
        "counter",
        "Times a route's escalation rate passed the limit and it started one rung higher.",
        (({"route": r}, guard.trips[r]) for r in routes),
    )
    lines += _metric(
        "switchyard_cascade_thrash_active",
        "gauge",
        "1 while the thrash guard starts the route one rung higher.",
        (({"route": r}, float(r in cooling)) for r in routes),
    )
    lines += _metric(
        "switchyard_cascade_moved_up_total",
        "counter",
        "Requests the thrash guard started one rung higher.",
        (({"route": r}, cascade.moved_up[r]) for r in routes),
    )
    lines += _metric(
        "switchyard_cascade_hedge_wins_total",
        "counter",
        "Hedged requests, by the rung whose answer was used.",
        (({"model": m}, n) for m, n in sorted(cascade.hedges.items())),
    )
    return lines
