"""The proxy's Prometheus metrics: one `CollectorRegistry` per app, never the global default one
(tests build many apps in one process).

Every family of the metric contract is registered when `Metrics()` is built, so a scrape lists it
(HELP and TYPE) before its first sample. Gauges that describe the present (readiness, breaker
state, in-flight, ...) are not kept here: `switchyard.gateway.gauges` reads them at scrape time.
Labels carry model, backend, tier, team and route names only: never a request id, key or prompt.

With several worker processes (`switchyard serve --workers N`), the parent sets
PROMETHEUS_MULTIPROC_DIR before any worker imports prometheus_client: every counter and histogram
then keeps its values in a file there, which `/metrics` of any worker reads (`multiprocess_dir`).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

LLM_LATENCY_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_GAP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The folder of prometheus-client's multiprocess mode, when this process is one of several workers."""
    return os.environ.get(MULTIPROCESS_ENV) or None


def route_of(requested_model: str) -> str:
    """explicit | auto | cascade: how the request named its model."""
    return requested_model if requested_model in ("auto", "cascade") else "explicit"


class Metrics:
    """The counters and histograms recorded as requests run."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # team -> share of its tightest budget spent: read from the limiter (Valkey, maybe) just
        # before each scrape, since a collector cannot wait on it
        self.budget_used_ratio: dict[str, float] = {}
        r = self.registry
        self.requests = Counter(
            "switchyard_requests",
            "Requests for a model, each once when it ended (refusals before routing too), by the model that "
            "answered last (else the configured one named, else ''), backend, tier, route and HTTP status.",
            ("model", "backend", "tier", "route", "status"),
            registry=r,
        )
        self.ttft = Histogram(
            "switchyard_time_to_first_token_seconds",
            "Time from an attempt's start to its answer's first token (streams; whole answers when known).",
            ("model",),
            buckets=LLM_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token = Histogram(
            "switchyard_inter_token_latency_seconds",
            "Time between two chunks of a stream sent to the client.",
            ("model",),
            buckets=TOKEN_GAP_BUCKETS_S,
            registry=r,
        )
        self.duration = Histogram(
            "switchyard_request_duration_seconds",
            "Time from the request reaching the relay to its last byte (a stream's end); refusals are not observed.",
            ("model",),
            buckets=LLM_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.overhead = Histogram(
            "switchyard_proxy_overhead_seconds",
            "Time a whole (non-stream) request spent in the proxy: its duration minus the attempts' time.",
            buckets=OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.classifier_decision = Histogram(
            "switchyard_classifier_decision_seconds",
            "Time the auto route waited on the classifier's score (batching and cache included).",
            buckets=OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.escalations = Counter(
            "switchyard_cascade_escalations",
            "Cascade climbs from one rung to the next, by reason (low-confidence, no-logprobs, error).",
            ("from_rung", "to_rung", "reason"),
            registry=r,
        )
        self.cost = Counter(
            "switchyard_cost_usd",
            "What attempts cost, by team ('' without teams) and model.",
            ("team", "model"),
            registry=r,
        )
        self.tokens = Counter(
            "switchyard_tokens",
            "Tokens of attempts (the upstream's usage, else estimated), by team, model and kind.",
            ("team", "model", "kind"),
            registry=r,
        )
        self.cache_tokens = Counter(
            "switchyard_cache_tokens",
            "Prompt tokens of attempts that the upstream read from its prompt cache (kind read) or wrote to it "
            "(kind write), by team and model; they are among switchyard_tokens_total's prompt tokens.",
            ("team", "model", "kind"),
            registry=r,
        )
        self.response_cache = Counter(
            "switchyard_response_cache_requests",
            "Requests the response cache could serve, by result (hit, miss, bypass), team ('' without teams) "
            "and route (auto, cascade, or the model named).",
            ("result", "team", "route"),
            registry=r,
        )
        self.response_cache_saved = Counter(
            "switchyard_response_cache_saved_usd",
            "What the response cache's hits saved: the cost of the answers they replayed, by team and route.",
            ("team", "route"),
            registry=r,
        )
        self.route_decisions = Counter(
            "switchyard_route_decisions",
            "model='auto' decisions by the tier chosen and why: score (the classifier's), value (routing "
            "by value: each tier's predicted quality and price), no-router, "
            "score-unavailable (late or failed: the default tier), or the constraint that moved it last "
            "(team, capability, context, health, budget).",
            ("tier", "reason"),
            registry=r,
        )
        self.fallbacks = Counter(
            "switchyard_fallbacks",
            "Requests answered by a fallback model instead of the one routed to.",
            ("from_model", "to_model"),
            registry=r,
        )
        self.rate_limited = Counter(
            "switchyard_rate_limited",
            "Requests refused by a rate limit (429), by team ('' for the global limits) and limit (requests, tokens).",
            ("team", "limit"),
            registry=r,
        )
        self.refusals = Counter(
            "switchyard_refusals",
            "Requests answered with an error before any model was called, by team ('' without a valid key) "
            "and reason (budget, rate_limit, else the error code: invalid_request, unsupported_parameter, ...).",
            ("team", "reason"),
            registry=r,
        )
        self.batch_lines = Counter(
            "switchyard_batch_lines",
            "Batch lines this process ran to a result, by endpoint and outcome (answered, failed: an entry "
            "of the error file); also counted in switchyard_requests_total.",
            ("endpoint", "outcome"),
            registry=r,
        )
        self.shadow_requests = Counter(
            "switchyard_shadow_requests",
            "Shadow sampling (switchyard.learning), by outcome: sampled (queued), dropped (the queue was full), "
            "over_budget (the platform's shadow budget for the day was spent), failed (the shadow call failed), "
            "completed (the shadow answered), labelled (the pair was graded), unlabelled (no grade), "
            "feedback (a client's score was stored).",
            ("outcome",),
            registry=r,
        )
        self.routed_requests = Counter(
            "switchyard_routed_requests",
            "Requests to auto or cascade that reached a model, once when they ended, by entry point and how "
            "they ended: accepted (the first rung, or the model routed to, answered), escalated (a rung above "
            "the first answered), failed (nothing answered).",
            ("entry", "outcome"),
            registry=r,
        )
        self.routing_version_requests = Counter(
            "switchyard_routing_version_requests",
            "Requests to auto or cascade that reached a model, once when they ended, by the routing version "
            "that routed them (thresholds file and classifier artifact), its role (current, candidate) and how "
            "they ended (accepted, escalated, failed; as switchyard_routed_requests_total).",
            ("version", "role", "outcome"),
            registry=r,
        )
        self.request_ttfb = Histogram(
            "switchyard_request_ttfb_seconds",
            "Time from the proxy receiving a request to the first byte of its answer's body, as the client "
            "saw it, by route (explicit, or entry point:outcome); requests that reached a model only.",
            ("route",),
            buckets=LLM_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_ttlb = Histogram(
            "switchyard_request_ttlb_seconds",
            "Time from the proxy receiving a request to the last byte of its answer, as the client saw it, "
            "by route (explicit, or entry point:outcome); requests that reached a model only.",
            ("route",),
            buckets=LLM_LATENCY_BUCKETS_S,
            registry=r,
        )

        # labelled children by their label values: `.labels()` validates and locks on every call,
        # and the same few models, teams and statuses come back request after request
        self._request_children: dict[tuple[str, str, str, str, int], tuple[Any, Any]] = {}
        self._attempt_children: dict[tuple[str, str], tuple[Any, Any, Any, Any, Any, Any]] = {}
        self._seen_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}  # (entry point, outcome)

    def request_done(self, *, model: str, backend: str, tier: str, route: str, status: int, duration_s: float) -> None:
        key = (model, backend, tier, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = (self.requests.labels(model, backend, tier, route, str(status)), self.duration.labels(model))
            self._request_children[key] = children
        requests, duration = children
        requests.inc()
        duration.observe(duration_s)

    def request_refused(self, *, model: str, tier: str, route: str, status: int) -> None:
        """A request refused before any model was called: counted, but no duration (a refusal's
        near-zero time would drag the latency percentiles down)."""
        self.requests.labels(model, "", tier, route, str(status)).inc()

    def refused(self, team: str | None, reason: str) -> None:
        self.refusals.labels(team or "", reason).inc()

    def route_decided(self, tier: str, reason: str) -> None:
        self.route_decisions.labels(tier, reason).inc()

    def fell_back(self, from_model: str, to_model: str) -> None:
        self.fallbacks.labels(from_model, to_model).inc()

    def response_cache_done(self, result: str, team: str | None, route: str, saved_usd: float) -> None:
        self.response_cache.labels(result, team or "", route).inc()
        if result == "hit":
            self.response_cache_saved.labels(team or "", route).inc(saved_usd)

    def rate_limit_refused(self, team: str | None, limit: str) -> None:
        self.rate_limited.labels(team or "", limit).inc()

    def attempt_done(
        self,
        *,
        team: str | None,
        model: str,
        prompt: int,
        completion: int,
        cost_usd: float,
        ttft_s: float | None,
        cache_read: int = 0,
        cache_write: int = 0,
    ) -> None:
        team = team or ""
        children = self._attempt_children.get((team, model))
        if children is None:
            children = (
                self.tokens.labels(team, model, "prompt"),
                self.tokens.labels(team, model, "completion"),
                self.cost.labels(team, model),
                self.ttft.labels(model),
                self.cache_tokens.labels(team, model, "read"),
                self.cache_tokens.labels(team, model, "write"),
            )
            self._attempt_children[(team, model)] = children
        prompt_tokens, completion_tokens, cost, ttft, cache_read_tokens, cache_write_tokens = children
        prompt_tokens.inc(prompt)
        completion_tokens.inc(completion)
        cost.inc(cost_usd)
        if cache_read:
            cache_read_tokens.inc(cache_read)
        if cache_write:
            cache_write_tokens.inc(cache_write)
        if ttft_s is not None:
            ttft.observe(max(ttft_s, 0.0))

    def escalated(self, from_rung: str, to_rung: str, reason: str) -> None:
        self.escalations.labels(from_rung, to_rung, reason).inc()

    def request_seen(
        self, *, requested_model: str, escalation: str, ttfb_s: float | None, ttlb_s: float | None
    ) -> None:
        """A request that reached a model, as its client saw it: a routed one counted by how it
        ended (`escalation`: accepted | escalated | failed), its times (None: not seen) by route."""
        entry = route_of(requested_model)
        children = self._seen_children.get((entry, escalation))
        if children is None:
            route = entry if entry == "explicit" else f"{entry}:{escalation}"
            routed = self.routed_requests.labels(entry, escalation) if entry != "explicit" else None
            children = (routed, self.request_ttfb.labels(route), self.request_ttlb.labels(route))
            self._seen_children[(entry, escalation)] = children
        routed, ttfb, ttlb = children
        if routed is not None:
            routed.inc()
        if ttfb_s is not None:
            ttfb.observe(max(ttfb_s, 0.0))
        if ttlb_s is not None:
            ttlb.observe(max(ttlb_s, 0.0))


class HistogramTally:
    """Observations of one histogram child counted here and added to it at once (`flush`): a
    stream's inter-token gaps, one per chunk, would each take the child's value locks twice.

    The same buckets as `Histogram.observe` (a value goes to the first upper bound at or above it);
    the counts reach the child through its bucket and sum values, which is all `observe` does
    without an exemplar. Nothing is seen on a scrape before `flush`."""

    __slots__ = ("child", "bounds", "counts", "total")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self.bounds: list[float] = child._upper_bounds  # prometheus-client's own, ending with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def add(self, value: float) -> None:
        self.total += value
        self.counts[bisect_left(self.bounds, value)] += 1

    def flush(self) -> None:
        """What was counted, to the histogram; the tally starts again from nothing."""
        if not any(self.counts):
            return
        self.child._sum.inc(self.total)
        for bucket, count in zip(self.child._buckets, self.counts, strict=True):
            if count:
                bucket.inc(count)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
