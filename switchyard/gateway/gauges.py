"""What `/metrics` reads at scrape time: the gauges that describe the present (readiness,
saturation, breakers, in-flight, queues, budgets) and the counters other objects keep (shed,
attempts, the cascade's verdicts).

One process: `LiveGauges` is registered in the app's own registry beside the counters and
histograms of `switchyard.core.metrics`, and builds these families at each scrape.

Several workers (`switchyard serve --workers N`, prometheus-client's multiprocess mode): each
worker copies the same values into real `Gauge`s and `Counter`s (`SharedGauges`, every second and
before a scrape it answers), whose files in PROMETHEUS_MULTIPROC_DIR every worker reads; each
gauge says how the workers' values combine (`LiveFamily.mode`). When a worker dies, the parent
folds its counter and histogram files into one file per kind (`retire_process`), so the folder
does not grow with every worker started again; scrapes read the folder under a shared lock, so
none sees those values twice or not at all.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from switchyard.core.drift import DriftMonitor
from switchyard.core.errors import LimitsUnavailable
from switchyard.core.file_locks import file_lock
from switchyard.core.metrics import multiprocess_dir
from switchyard.gateway.saturation import is_saturated

FOLDER_LOCK = "folder.lock"  # the multiprocess folder's lock file (not a `*.db`, which the collector would read)

MultiprocessMode: TypeAlias = Literal[
    "all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent", "livemostrecent"
]  # prometheus-client's multiprocess_mode
BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}
SHARED_SYNC_INTERVAL_S = 1.0

__all__ = ["CONTENT_TYPE_LATEST", "LiveGauges", "SharedGauges", "exposition", "retire_process"]
RETIRED_KINDS = ("counter", "histogram")  # the kinds whose values outlive their process (not the live gauges)


async def exposition(services) -> bytes:
    """The text of one scrape; the budgets are read first (a shared limiter is awaited)."""
    try:
        services.metrics.budget_used_ratio = await services.budgets.used_ratios(services.directory.teams.values())
    except LimitsUnavailable:
        services.metrics.budget_used_ratio = {}  # Valkey is down: no value rather than a stale one
    shared = services.shared_gauges
    if shared is None:
        return generate_latest(services.metrics.registry)
    shared.sync()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_AllWorkers(_listed_families(services)))
    return await asyncio.to_thread(generate_latest, registry)  # reads every worker's files


@dataclass
class LiveFamily:
    name: str
    kind: str  # gauge | counter
    help_text: str
    labels: tuple[str, ...] = ()
    # several workers: how their values combine (prometheus-client's multiprocess_mode); counters add up
    mode: MultiprocessMode = "livemax"
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, label_values: Iterable[str], value: float) -> None:
        self.samples.append((tuple(label_values), float(value)))

    def to_family(self) -> GaugeMetricFamily | CounterMetricFamily:
        kind = GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily
        family = kind(self.name, self.help_text, labels=list(self.labels))
        for label_values, value in self.samples:
            family.add_metric(list(label_values), value)
        return family


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = (), mode: MultiprocessMode = "livemax") -> LiveFamily:
    return LiveFamily(name, "gauge", help_text, labels, mode)


def _counter(name: str, help_text: str, labels: tuple[str, ...] = ()) -> LiveFamily:
    return LiveFamily(name, "counter", help_text, labels, "sum")


def live_families(state) -> Iterator[LiveFamily]:
    """The families read at scrape time, in the order a scrape lists them."""
    entries = list(state.registry)
    guards = {entry.name: state.executor.guard(entry) for entry in entries}
    ready = _gauge(
        "switchyard_model_ready", "1 when the model's backend passed its last health probe.", ("model",), "livemin"
    )
    saturated = _gauge("switchyard_model_saturated", "1 when the model's backend reports saturation.", ("model",))
    for e in entries:
        ready.add([e.name], e.backend.is_ready())
        saturated.add([e.name], is_saturated(e))
    yield ready
    yield saturated
    breaker = _gauge("switchyard_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.", ("model",))
    in_flight = _gauge("switchyard_in_flight", "Requests in flight at the model.", ("model",), "livesum")
    shed = _counter("switchyard_shed", "Requests turned away by load shedding.", ("model",))
    for name, guard in guards.items():
        breaker.add([name], BREAKER_STATES[guard.breaker_state])
        in_flight.add([name], guard.num_in_flight)
        shed.add([name], guard.num_shed)
    replica = _gauge(
        "switchyard_replica_breaker_state",
        "Circuit breaker of each replica of a model with several: 0 closed, 1 half-open, 2 open.",
        ("model", "replica"),
    )
    for model, replicas in state.executor.replica_states().items():
        for name, value in replicas.items():
            replica.add([model, name], BREAKER_STATES[value])
    yield from (breaker, replica, in_flight, shed)
    attempts = _counter("switchyard_attempts", "Attempts at a backend, by outcome.", ("model", "status"))
    for (model, status), n in sorted(state.attempt_counts.items()):
        attempts.add([model, status], n)
    yield attempts
    degraded = _counter("switchyard_degraded", "Best-effort requests sent to a smaller model.")
    degraded.add([], state.saturation.num_degraded)
    waiting = _gauge("switchyard_priority_waiting", "Priority requests waiting out saturation.", mode="livesum")
    waiting.add([], state.saturation.num_waiting)
    yield degraded
    yield waiting
    cache = state.response_cache
    if cache is not None:
        stored = _gauge(
            "switchyard_response_cache_entries", "Answers in this process's response cache.", mode="livesum"
        )
        stored.add([], cache.num_entries())
        yield stored
    queue = _gauge(
        "switchyard_queue_depth_tokens",
        "Tokens (prompt estimate plus max_tokens or its default) waiting for a first token at the model: "
        "the embedded engine's own queue; for other backends, what this proxy sent that has no first token yet.",
        ("model",),
        "livesum",
    )  # each worker runs its own embedded engine and counts what it sent
    for e in entries:
        queued_tokens = getattr(e.backend, "queued_tokens", None)  # the embedded engine knows its own
        queue.add([e.name], queued_tokens() if queued_tokens is not None else state.executor.waiting.of(e.name))
    budget = _gauge(
        "switchyard_budget_used_ratio", "Share of the team's tightest budget spent.", ("team",), "livemostrecent"
    )  # read from the shared limiter: the latest reading of any worker
    for team, ratio in sorted(state.metrics.budget_used_ratio.items()):
        budget.add([team], ratio)
    yield queue
    yield budget
    drafts = _counter(
        "switchyard_engine_draft_tokens",
        "Draft tokens the embedded engine verified (speculative decoding).",
        ("model",),
    )
    accepted = _counter(
        "switchyard_engine_draft_tokens_accepted", "Draft tokens the embedded engine's model accepted.", ("model",)
    )
    for e in entries:
        draft_counts = getattr(e.backend, "draft_counts", None)  # embedded models only
        if draft_counts is not None:
            num_drafts, num_accepted = draft_counts()
            drafts.add([e.name], num_drafts)
            accepted.add([e.name], num_accepted)
    yield drafts
    yield accepted
    yield from _prefix_cache_families(entries)
    scorer = state.auto_router.scorer if state.auto_router is not None else None
    if scorer is not None:
        batches = _counter("switchyard_classifier_batches", "Classifier forward passes.")
        batches.add([], scorer.num_batches)
        scored = _counter("switchyard_classifier_scored", "Prompts scored (cache misses).")
        scored.add([], scorer.num_scored)
        yield batches
        yield scored
    if state.cascade is not None:
        yield from _cascade_families(state.cascade)
    if state.drift is not None:
        yield from _drift_families(state.drift)
    yield from _routing_families(state)


def _routing_families(state) -> Iterator[LiveFamily]:
    """1 for each routing version running, 0 for one a reload replaced (several workers keep a
    gauge's last value: a version gone must say so)."""
    info = _gauge(
        "switchyard_routing_version_info",
        "1 for each routing version (thresholds file and classifier artifact) routing auto and cascade "
        "requests, by role (current, candidate); 0 for one a reload replaced.",
        ("version", "role"),
    )
    running = {(routing.version, routing.role) for routing in state.routings}
    for version, role in sorted(state.routing_history | running):
        info.add([version, role], (version, role) in running)
    share = _gauge("switchyard_rollout_share", "The candidate routing version's share of auto and cascade requests.")
    share.add([], state.routings.share if state.routings.candidate is not None else 0.0)
    yield info
    yield share


class LiveGauges(Collector):
    def __init__(self, services) -> None:
        self.services = services

    def describe(self) -> list:
        return []  # nothing to check at registration: the names are the collector's own

    def collect(self) -> Iterator:
        for family in live_families(self.services):
            yield family.to_family()


class SharedGauges:
    """This worker's live values, copied into multiprocess-mode metrics (see the module's doc)."""

    def __init__(self, services) -> None:
        self.services = services
        self._metrics: dict[str, Gauge | Counter] = {}
        self._counted: dict[tuple[str, tuple[str, ...]], float] = {}
        self.families: dict[str, LiveFamily] = {}  # the last copy's, for their help texts and types

    def sync(self) -> None:
        for family in live_families(self.services):
            self.families[family.name] = family
            metric = self._metrics.get(family.name)
            if metric is None:
                metric = self._metrics[family.name] = self._build(family)
            for label_values, value in family.samples:
                child = metric.labels(*label_values) if family.labels else metric
                if isinstance(child, Gauge):
                    child.set(value)
                    continue
                key = (family.name, label_values)
                if (delta := value - self._counted.get(key, 0.0)) > 0:
                    child.inc(delta)
                    self._counted[key] = value

    async def sync_forever(self) -> None:
        while True:
            self.sync()
            await asyncio.sleep(SHARED_SYNC_INTERVAL_S)

    @staticmethod
    def _build(family: LiveFamily) -> Gauge | Counter:
        if family.kind == "counter":
            return Counter(family.name, family.help_text, family.labels, registry=None)
        return Gauge(family.name, family.help_text, family.labels, registry=None, multiprocess_mode=family.mode)


def _listed_families(services) -> dict[str, tuple[str, str]]:
    """name -> (type, help) of every family a scrape lists: the contract's, in order, then the live ones."""
    known = {metric.name: (metric.type, metric.documentation) for metric in services.metrics.registry.collect()}
    for family in services.shared_gauges.families.values():
        known.setdefault(family.name, (family.kind, family.help_text))
    return known


class _AllWorkers(Collector):
    """Every worker's values, every family listed (HELP and TYPE) even before its first sample."""

    def __init__(self, known: dict[str, tuple[str, str]]) -> None:
        self.known = known

    def collect(self) -> Iterator[Metric]:
        folder = multiprocess_dir()
        assert folder is not None
        with file_lock(os.path.join(folder, FOLDER_LOCK), fcntl.LOCK_SH):
            merged = {metric.name: metric for metric in MultiProcessCollector(None, path=folder).collect()}
        for name, (kind, help_text) in self.known.items():
            metric = merged.pop(name, None)
            if metric is None:
                yield Metric(name, help_text, kind)
                continue
            metric.documentation = help_text
            yield metric
        yield from merged.values()


def retire_process(pid: int, folder: str) -> None:
    """A dead worker's values in the multiprocess folder: its live gauges go; its counters and
    histograms are added into `counter_retired.db` and `histogram_retired.db` and its own files
    removed, so that they still count but the number of files stays bounded."""
    with file_lock(os.path.join(folder, FOLDER_LOCK)):
        mark_process_dead(pid, folder)
        for kind in RETIRED_KINDS:
            dead = os.path.join(folder, f"{kind}_{pid}.db")
            if not os.path.exists(dead):
                continue
            retired = MmapedDict(os.path.join(folder, f"{kind}_retired.db"))
            try:
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(dead):
                    total, _ = retired.read_value(key)
                    retired.write_value(key, total + value, timestamp)
            finally:
                retired.close()
            os.remove(dead)


def _prefix_cache_families(entries) -> Iterator[LiveFamily]:
    queries = _counter(
        "switchyard_engine_prefix_cache_queries",
        "Prompt tokens the embedded engine looked up in its prefix cache.",
        ("model",),
    )
    hits = _counter(
        "switchyard_engine_prefix_cache_hits",
        "Prompt tokens the embedded engine found in its prefix cache (their KV reused, not computed).",
        ("model",),
    )
    held = _gauge(
        "switchyard_engine_prefix_cache_tokens",
        "Tokens whose KV the embedded engine's batch cache holds for prefix reuse (in use or kept).",
        ("model",),
        "livesum",
    )  # each worker runs its own engine
    for e in entries:
        stats_of = getattr(e.backend, "prefix_cache_stats", None)  # embedded models only
        stats = stats_of() if stats_of is not None else None
        if stats is not None:
            queries.add([e.name], stats.num_query_tokens)
            hits.add([e.name], stats.num_hit_tokens)
            held.add([e.name], stats.num_cached_tokens)
    yield from (queries, hits, held)


def _cascade_families(cascade) -> Iterator[LiveFamily]:
    guard = cascade.guard
    routes = cascade.names[:-1]
    cooling = set(guard.cooling_routes())
    judged = _counter(
        "switchyard_cascade_judged",
        "Answers the cascade judged, by verdict (accepted, escalated, no-logprobs, error).",
        ("model", "verdict"),
    )
    for (model, verdict), n in sorted(cascade.judged.items()):
        judged.add([model, verdict], n)
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
        trips.add([route], guard.trips[route])
        active.add([route], route in cooling)
        moved.add([route], cascade.moved_up[route])
    hedges = _counter(
        "switchyard_cascade_hedge_wins", "Hedged requests, by the rung whose answer was used.", ("model",)
    )
    for model, n in sorted(cascade.hedges.items()):
        hedges.add([model], n)
    losses = _counter(
        "switchyard_cascade_hedge_losses",
        "Hedged requests, by the rung whose answer was dropped (cancelled) for the winner's.",
        ("model",),
    )
    for model, n in sorted(cascade.hedge_losses.items()):
        losses.add([model], n)
    yield from (judged, trips, active, moved, hedges, losses)


def _drift_families(drift: DriftMonitor) -> Iterator[LiveFamily]:
    """Several workers: each measures its own window; PSI is the worst worker's (an alarm from any
    window is an alarm), a rate the latest worker's (every window samples the same traffic)."""
    index = _gauge(
        "switchyard_drift_psi",
        "Population stability index of the signal's live window against the loaded version's reference.",
        ("signal",),
        "livemax",
    )
    rate = _gauge(
        "switchyard_drift_rate",
        "The strong-call share (signal classifier_score) or escalation rate (cascade_confidence), observed "
        "in the live window or predicted by the loaded version; the share of graded shadow pairs the weak "
        "side won or tied (weak_win_rate, observed).",
        ("signal", "kind"),
        "livemostrecent",
    )
    samples = _gauge("switchyard_drift_window_samples", "Values in the signal's live window.", ("signal",), "livemax")
    reference = _gauge(
        "switchyard_drift_reference_samples",
        "Values in the signal's reference, by source: file (the thresholds file) or warm-up (the first "
        "window after load).",
        ("signal", "source"),
        "livemax",
    )
    bound = _gauge("switchyard_drift_psi_alert", "The PSI above which drift alerts (drift.psi_alert).", (), "livemax")
    bound.add([], drift.psi_alert)
    for reading in drift.readings():
        if reading.psi is not None:
            index.add([reading.signal], reading.psi)
        if reading.observed_rate is not None:
            rate.add([reading.signal, "observed"], reading.observed_rate)
        if reading.predicted_rate is not None:
            rate.add([reading.signal, "predicted"], reading.predicted_rate)
        samples.add([reading.signal], reading.num_samples)
        if reading.reference_source is not None:
            reference.add([reading.signal, reading.reference_source], reading.num_reference_samples)
    yield from (index, rate, samples, reference, bound)
