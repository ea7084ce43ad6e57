"""Streaming aggregation of usage records: sums per day, team, model and hosting, in one pass.

Nothing here keeps a row: each record adds to a few counters (attempts feed the cost tables and
the latency reservoirs; `RequestTracker` joins them into requests for the route mix, the
escalation rate and the savings). Days are UTC days of `started_at`; a request belongs to the
day its first attempt started.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from switchyard.billing.records import REFUSED, UsageRecord
from switchyard.billing.report.confidence import ConfidenceSums
from switchyard.billing.report.drift import DriftReferences, new_drift_sums
from switchyard.billing.report.refusals import Refusals
from switchyard.billing.report.requests import OUTCOMES, ROUTED_KINDS, RequestTrace, RequestTracker
from switchyard.billing.report.reservoir import Reservoir
from switchyard.billing.report.versions import VersionSums, is_strong_answer

NO_TEAM = "(none)"
# an attempt's kind: a shadow call (paid by the platform), a batch's line, or any other
INTERACTIVE, BATCH, SHADOW = "interactive", "batch", "shadow"
UNKNOWN_HOSTING = "unknown"


def utc_day(ts: float) -> date:
    return datetime.fromtimestamp(ts, UTC).date()


def escalation_reason(error: str | None) -> str:
    """The reason's name without its figures, spelt as the metrics spell it (words joined by
    hyphens): `low-confidence (0.31 < 0.5)` and older rows' `low confidence` → `low-confidence`."""
    text = (error or "").split("(", 1)[0].split(":", 1)[0].strip().lower()
    return "-".join(text.split()) or "unspecified"


@dataclass(slots=True)
class Sums:
    """Attempts and what they cost; `requests` counts first attempts (one per client request)."""

    attempts: int = 0
    requests: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cache_read_tokens: int = 0  # of the prompt tokens, read from a prompt cache
    cache_write_tokens: int = 0  # of the prompt tokens, written to one
    response_cache_hits: int = 0  # requests answered from the response cache
    response_cache_misses: int = 0  # requests the cache could have answered and did not
    response_cache_saved_usd: float = 0.0  # what the hits' answers cost when they were first given

    def add(self, record: UsageRecord) -> None:
        self.attempts += 1
        self.requests += record.attempt == 1
        self.completed += record.status == "completed"
        self.prompt_tokens += record.prompt_tokens
        self.completion_tokens += record.completion_tokens
        self.cost_usd += record.cost_usd
        self.cache_read_tokens += record.cache_read_tokens or 0
        self.cache_write_tokens += record.cache_write_tokens or 0
        self.response_cache_hits += record.response_cache == "hit"
        self.response_cache_misses += record.response_cache == "miss"
        self.response_cache_saved_usd += record.response_cache_saved_usd or 0.0

    def merge(self, other: Sums) -> None:
        self.attempts += other.attempts
        self.requests += other.requests
        self.completed += other.completed
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.response_cache_hits += other.response_cache_hits
        self.response_cache_misses += other.response_cache_misses
        self.response_cache_saved_usd += other.response_cache_saved_usd

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def usd_per_mtok(self) -> float | None:
        return self.cost_usd / self.tokens * 1e6 if self.tokens else None


@dataclass(slots=True)
class RouteSums:
    """Requests of one route label, split by outcome, and what they cost."""

    outcomes: Counter[str] = field(default_factory=Counter)
    cost_usd: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.outcomes[o] for o in OUTCOMES)


@dataclass(slots=True)
class SavingsSums:
    """Routed requests of one day and kind: realised cost against the strongest-model ceiling."""

    requests: int = 0
    realised_cost_usd: float = 0.0
    ceiling_cost_usd: float = 0.0
    num_without_ceiling: int = 0

    @property
    def savings_usd(self) -> float:
        return self.ceiling_cost_usd - self.realised_cost_usd

    @property
    def savings_pct(self) -> float | None:
        return 100 * self.savings_usd / self.ceiling_cost_usd if self.ceiling_cost_usd else None


@dataclass(slots=True)
class EscalationSums:
    """Routed requests of one entry point (auto or cascade) and how many escalated."""

    requests: int = 0
    escalated: int = 0

    @property
    def rate(self) -> float | None:
        return self.escalated / self.requests if self.requests else None


NO_KEY = "(no key)"


class Aggregator:
    """Feed it records (`add`), then `finish()`; the public dicts hold the report's numbers."""

    def __init__(
        self,
        *,
        since: date | None = None,
        until: date | None = None,
        team: str | None = None,
        reservoir_size: int = 4096,
        hosting: Mapping[str, str] | None = None,
        drift: DriftReferences | None = None,
        judged: Mapping[str, float] | None = None,
    ) -> None:
        self.since, self.until, self.team = since, until, team
        self.drift = new_drift_sums(drift)  # None: no reference to compare with
        self.judged = judged or {}  # request id -> its answer's judged quality (learning rows)
        self.hosting_overrides = dict(hosting or {})  # model -> hosting, over what its records say
        self.reservoir_size = reservoir_size
        self.num_records = 0
        self.num_skipped = 0  # outside the period or of another team
        self.totals = Sums()
        self.by_team_day: dict[tuple[date, str], Sums] = defaultdict(Sums)
        self.by_key: dict[tuple[str, str], Sums] = defaultdict(Sums)  # (team, key id) over the period
        self.by_model_day: dict[tuple[date, str], Sums] = defaultdict(Sums)
        self.by_model: dict[str, Sums] = defaultdict(Sums)
        self.by_team_model: dict[tuple[str, str], Sums] = defaultdict(Sums)  # over the period
        self.by_hosting: dict[str, Sums] = defaultdict(Sums)
        self.by_kind_day: dict[tuple[date, str], Sums] = defaultdict(Sums)  # kind: interactive | batch | shadow
        self.hosting_of_model: dict[str, str] = {}
        self.latency_ms: dict[str, Reservoir] = {}
        self.ttft_ms: dict[str, Reservoir] = {}
        self.route_mix: dict[str, RouteSums] = defaultdict(RouteSums)
        # escalation, per request: (day, entry point) -> requests and escalated ones; (day, entry, reason)
        self.escalation_by_day: dict[tuple[date, str], EscalationSums] = defaultdict(EscalationSums)
        self.escalation_reasons: Counter[tuple[date, str, str]] = Counter()
        self.confidence = ConfidenceSums()  # the cascade's judged answers
        # as the client saw it, per route label: time to first byte, total, and the total beyond the
        # answering attempt's own duration (routing, rungs judged and dropped, retries)
        self.client_ttfb_ms: dict[str, Reservoir] = {}
        self.client_duration_ms: dict[str, Reservoir] = {}
        self.client_added_ms: dict[str, Reservoir] = {}
        self.savings: dict[tuple[date, str], SavingsSums] = defaultdict(SavingsSums)
        self.num_requests = 0  # requests joined from their attempts (shadow-only ones left out)
        self.by_version: dict[tuple[str, str], VersionSums] = defaultdict(VersionSums)  # (version, entry)
        self.refusals = Refusals()  # refused requests: counted apart, in no other figure
        self._tracker = RequestTracker(self._add_request)

    def add(self, record: UsageRecord) -> None:
        day = utc_day(record.started_at)
        if (
            (self.since is not None and day < self.since)
            or (self.until is not None and day > self.until)
            or (self.team is not None and record.team != self.team)
        ):
            self.num_skipped += 1
            return
        team = record.team or NO_TEAM
        if record.status == REFUSED:
            self.refusals.add(record, team, record.key_id or NO_KEY)
            return
        self.num_records += 1
        recorded = self.hosting_overrides.get(record.model) or record.hosting
        hosting = recorded or self.hosting_of_model.get(record.model, UNKNOWN_HOSTING)
        if recorded:
            self.hosting_of_model[record.model] = recorded
        for sums in (
            self.totals,
            self.by_team_day[(day, team)],
            self.by_key[(team, record.key_id or NO_KEY)],
            self.by_model_day[(day, record.model)],
            self.by_model[record.model],
            self.by_team_model[(team, record.model)],
            self.by_hosting[hosting],
            self.by_kind_day[(day, SHADOW if record.is_shadow else BATCH if record.batch_id else INTERACTIVE)],
        ):
            sums.add(record)
        if record.status == "completed":
            self._sample(self.latency_ms, record.model, record.duration_ms)
            if record.ttft_ms is not None:
                self._sample(self.ttft_ms, record.model, record.ttft_ms)
        if record.threshold is not None:
            self.confidence.add(record)
        if self.drift is not None:
            self.drift.add(record, day)
        self._tracker.add(record, day, team)

    def add_batch(self, records: list[UsageRecord]) -> None:
        for record in records:
            self.add(record)

    def finish(self) -> None:
        self._tracker.finish()

    def _sample(self, reservoirs: dict[str, Reservoir], model: str, value: float) -> None:
        reservoir = reservoirs.get(model)
        if reservoir is None:
            reservoir = reservoirs[model] = Reservoir(self.reservoir_size, seed=len(reservoirs))
        reservoir.add(value)

    def _add_request(self, trace: RequestTrace) -> None:
        if trace.num_attempts == 0:
            return
        self.num_requests += 1
        route = self.route_mix[trace.route_label]
        route.outcomes[trace.outcome] += 1
        route.cost_usd += trace.cost_usd
        if trace.kind in ROUTED_KINDS:
            escalation = self.escalation_by_day[(trace.day, trace.kind)]
            escalation.requests += 1
            reason = trace.escalation_reason
            if reason is not None:
                escalation.escalated += 1
                self.escalation_reasons[(trace.day, trace.kind, escalation_reason(reason))] += 1
        if trace.client_duration_ms is not None:
            label = trace.route_label
            self._sample(self.client_duration_ms, label, trace.client_duration_ms)
            if trace.client_ttfb_ms is not None:
                self._sample(self.client_ttfb_ms, label, trace.client_ttfb_ms)
            if trace.sent_attempt_ms is not None:
                self._sample(self.client_added_ms, label, max(trace.client_duration_ms - trace.sent_attempt_ms, 0.0))
        if trace.kind in ROUTED_KINDS and trace.routing_version is not None:
            self.by_version[(trace.routing_version, trace.kind)].add(
                cost_usd=trace.cost_usd,
                is_escalated=trace.escalation == "escalated",
                is_strong=is_strong_answer(trace.answer_cost_usd, trace.answer_ceiling_usd),
                quality=self.judged.get(trace.request_id),
            )
        if trace.kind in ROUTED_KINDS:
            savings = self.savings[(trace.day, trace.kind)]
            savings.requests += 1
            savings.realised_cost_usd += trace.cost_usd
            savings.ceiling_cost_usd += trace.ceiling_cost_usd
            savings.num_without_ceiling += trace.num_without_ceiling
