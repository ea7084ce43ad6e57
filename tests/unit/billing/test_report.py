"""The report's numbers, checked against a small ledger worked out by hand.

Two UTC days (2026-11-02 and -03), teams `search`, `support` and none; models `small-m`, `mid-m`,
`large-m` (self-hosted), `big-c` (commercial), `shadow-m` (hosting not recorded). Every attempt
that produced tokens has 100 prompt + 50 completion tokens; failed attempts have none.

    day 0  r1  search   auto->small      completed small-m 0.002 (ceiling 0.020)
           r2  search   auto->large      failed large-m, completed big-c 0.010 (ceiling 0.010)  fallback
           r3  support  cascade          escalated small-m 0.001 "low confidence (0.31 < 0.5)",
                                         completed big-c 0.008 (ceiling 0.008)
           r4  support  cascade          completed small-m 0.001 (ceiling 0.008)
           r5  -        big-c (direct)   completed big-c 0.005
    day 1  r6  search   auto->small(degraded)  completed small-m 0.001 (ceiling 0.020)
           r7  search   cascade          failed small-m, failed big-c                            failed
           r8  support  cascade          escalated small-m 0.001 "low confidence", escalated mid-m
                                         0.002 "refusal", completed big-c 0.008 (ceiling 0.008),
                                         and a shadow call on shadow-m 0.003
           (a rung above the first climbed from the one below it: `escalated_from`, as the proxy writes)
           r10 -        (old row)        completed small-m 0.0005, no requested model, route, hosting
           r11 search   big-c (direct)   cancelled big-c 0.002
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import UTC, date, datetime

import pytest

from switchyard.billing.records import UsageRecord
from switchyard.billing.report import build_report
from switchyard.billing.report.aggregate import Aggregator, escalation_reason
from switchyard.billing.report.requests import RequestTracker, request_kind, tier_in_route
from switchyard.billing.report.reservoir import Reservoir
from switchyard.billing.report.tables import build_summary, build_tables
from switchyard.core.prices import Price

DAY0, DAY1 = date(2026, 11, 2), date(2026, 11, 3)
T0 = datetime(2026, 11, 2, tzinfo=UTC).timestamp()
HOUR = 3600.0


def rec(request_id: str, attempt: int, at_h: float, model: str, status: str, cost: float, **extra) -> UsageRecord:
    tokens = (0, 0) if status == "failed" else (100, 50)
    extra.setdefault("duration_ms", 100.0)
    return UsageRecord(
        request_id=request_id,
        attempt=attempt,
        model=model,
        backend=model + "-deployment",
        status=status,
        prompt_tokens=tokens[0],
        completion_tokens=tokens[1],
        cost_usd=cost,
        is_estimated=False,
        started_at=T0 + at_h * HOUR,
        **extra,
    )


def ledger_records() -> list[UsageRecord]:
    """The ledger in the module docstring, ordered by started_at as the store returns it."""
    auto = {"requested_model": "auto"}
    cascade = {"requested_model": "cascade"}
    own, cloud = {"hosting": "self-hosted"}, {"hosting": "commercial"}
    records = [
        rec("r1", 1, 1.0, "small-m", "completed", 0.002, team="search", tier="small", ceiling_cost_usd=0.020,
            route="auto:classifier=0.200<0.45->small", ttft_ms=10.0, **auto, **own),
        rec("r2", 1, 2.0, "large-m", "failed", 0.0, team="search", tier="large", error="upstream 502",
            route="auto:classifier=0.700>=0.45->large", duration_ms=50.0, **auto, **own),
        rec("r3", 1, 2.1, "small-m", "escalated", 0.001, team="support", tier="small",
            error="low confidence (0.31 < 0.5)", route="cascade->small-m", **cascade, **own),
        rec("r2", 2, 2.2, "big-c", "completed", 0.010, team="search", tier="commercial", ceiling_cost_usd=0.010,
            route="auto:classifier=0.700>=0.45->large", duration_ms=1000.0, **auto, **cloud),
        rec("r3", 2, 2.3, "big-c", "completed", 0.008, team="support", tier="commercial", ceiling_cost_usd=0.008,
            escalated_from="small-m", duration_ms=2000.0, **cascade, **cloud),
        rec("r4", 1, 3.0, "small-m", "completed", 0.001, team="support", tier="small", ceiling_cost_usd=0.008,
            duration_ms=200.0, **cascade, **own),
        rec("r5", 1, 4.0, "big-c", "completed", 0.005, requested_model="big-c", tier="commercial",
            duration_ms=3000.0, ttft_ms=40.0, **cloud),
        rec("r6", 1, 25.0, "small-m", "completed", 0.001, team="search", tier="small", ceiling_cost_usd=0.020,
            route="auto:classifier=0.900>=0.45->small(degraded: large saturated)", duration_ms=300.0, **auto, **own),
        rec("r7", 1, 26.0, "small-m", "failed", 0.0, team="search", tier="small", error="timeout", **cascade, **own),
        rec("r7", 2, 26.1, "big-c", "failed", 0.0, team="search", tier="commercial", error="timeout", **cascade,
            **cloud),
        rec("r8", 1, 27.0, "small-m", "escalated", 0.001, team="support", tier="small", error="low confidence",
            **cascade, **own),
        rec("r8", 2, 27.1, "mid-m", "escalated", 0.002, team="support", tier="large", error="Refusal", **cascade,
            escalated_from="small-m", **own),
        rec("r8", 3, 27.2, "big-c", "completed", 0.008, team="support", tier="commercial", ceiling_cost_usd=0.008,
            duration_ms=4000.0, escalated_from="mid-m", **cascade, **cloud),
        rec("r8", 4, 27.3, "shadow-m", "completed", 0.003, team="support", is_shadow=True, duration_ms=500.0,
            **cascade),
        rec("r10", 1, 28.0, "small-m", "completed", 0.0005, duration_ms=400.0),
        rec("r11", 1, 29.0, "big-c", "cancelled", 0.002, team="search", requested_model="big-c", **cloud),
    ]  # fmt: skip
    return sorted(records, key=lambda r: r.started_at)


async def batches_of(records: Iterable[UsageRecord], size: int = 3) -> AsyncIterator[list[UsageRecord]]:
    records = list(records)
    for i in range(0, len(records), size):
        yield records[i : i + size]


def aggregate(records: Iterable[UsageRecord], **filters) -> Aggregator:
    aggregator = Aggregator(**filters)
    for record in records:
        aggregator.add(record)
    aggregator.finish()
    return aggregator


@pytest.fixture(scope="module")
def tables():
    return build_tables(aggregate(ledger_records()), {"big-c": Price(2.5, 10.0)})


def approx_rows(rows):
    return [tuple(pytest.approx(v) if isinstance(v, float) else v for v in row) for row in rows]


def test_cost_by_team_and_day(tables) -> None:
    assert list(tables["cost_by_team_day"].rows) == approx_rows(
        [
            # day, team, requests, attempts, prompt, completion, cost
            (DAY0, "(none)", 1, 1, 100, 50, 0.005),
            (DAY0, "search", 2, 3, 200, 100, 0.012),
            (DAY0, "support", 2, 3, 300, 150, 0.010),
            (DAY1, "(none)", 1, 1, 100, 50, 0.0005),
            (DAY1, "search", 3, 4, 200, 100, 0.003),
            (DAY1, "support", 1, 4, 400, 200, 0.014),
        ]
    )


def test_cost_by_model_and_day(tables) -> None:
    assert list(tables["cost_by_model_day"].rows) == approx_rows(
        [
            # day, model, attempts, completed, prompt, completion, cost
            (DAY0, "big-c", 3, 3, 300, 150, 0.023),
            (DAY0, "large-m", 1, 0, 0, 0, 0.0),
            (DAY0, "small-m", 3, 2, 300, 150, 0.004),
            (DAY1, "big-c", 3, 1, 200, 100, 0.010),
            (DAY1, "mid-m", 1, 0, 100, 50, 0.002),
            (DAY1, "shadow-m", 1, 1, 100, 50, 0.003),
            (DAY1, "small-m", 4, 2, 300, 150, 0.0025),
        ]
    )


def test_route_mix_splits_requests_by_route_and_outcome(tables) -> None:
    assert list(tables["route_mix"].rows) == approx_rows(
        [
            # route, requests, share, as_routed, fallback, degraded, failed, cost (shadow calls left out)
            ("auto:large", 1, 0.1, 0, 1, 0, 0, 0.010),
            ("auto:small", 2, 0.2, 1, 0, 1, 0, 0.003),
            ("cascade:accepted", 1, 0.1, 1, 0, 0, 0, 0.001),
            ("cascade:escalated", 2, 0.2, 2, 0, 0, 0, 0.020),
            ("cascade:failed", 1, 0.1, 0, 0, 0, 1, 0.0),
            ("direct", 2, 0.2, 2, 0, 0, 0, 0.007),
            ("unrecorded", 1, 0.1, 1, 0, 0, 0, 0.0005),
        ]
    )


def test_escalation_rate_and_reasons_per_day(tables) -> None:
    assert list(tables["escalation_by_day"].rows) == [
        # day, entry point, requests, escalated requests (a rung other than the first answered), rate
        (DAY0, "auto", 2, 0, 0.0),
        (DAY0, "cascade", 2, 1, 0.5),
        (DAY1, "auto", 1, 0, 0.0),
        (DAY1, "cascade", 2, 1, 0.5),  # r7 failed: a request, not an escalated one
    ]
    assert list(tables["escalation_reasons"].rows) == [
        # why each escalated request left its first rung (r8's second rung's "refusal" is not a request's)
        (DAY0, "cascade", "low-confidence", 1),
        (DAY1, "cascade", "low-confidence", 1),
    ]


def test_savings_against_the_strongest_model(tables) -> None:
    assert list(tables["savings_by_day"].rows) == approx_rows(
        [
            # day, route, requests, realised, ceiling, savings, savings %, completed without ceiling
            (DAY0, "auto", 2, 0.012, 0.030, 0.018, 60.0, 0),
            (DAY0, "cascade", 2, 0.010, 0.016, 0.006, 37.5, 0),
            (DAY1, "auto", 1, 0.001, 0.020, 0.019, 95.0, 0),
            (DAY1, "cascade", 2, 0.011, 0.008, -0.003, -37.5, 0),  # the escalations cost more than they saved
        ]
    )


def test_self_hosted_against_commercial_per_million_tokens(tables) -> None:
    assert list(tables["cost_by_hosting"].rows) == approx_rows(
        [
            # hosting, attempts, prompt, completion, cost, USD per 1M tokens
            ("commercial", 6, 500, 250, 0.033, 44.0),
            ("self-hosted", 9, 700, 350, 0.0085, 0.0085 / 1050 * 1e6),  # r10 inherits small-m's hosting
            ("unknown", 1, 100, 50, 0.003, 20.0),
        ]
    )
    models = {row["model"]: row for row in tables["models"].records()}
    assert models["big-c"]["price_input_usd_per_mtok"] == 2.5
    assert models["big-c"]["price_output_usd_per_mtok"] == 10.0
    assert models["small-m"]["price_input_usd_per_mtok"] is None
    assert models["large-m"]["usd_per_mtok"] is None  # no tokens: no rate, not a division by zero
    assert (models["small-m"]["hosting"], models["small-m"]["attempts"], models["small-m"]["completed"]) == (
        "self-hosted",
        7,
        4,
    )


def test_latency_and_ttft_percentiles_per_model(tables) -> None:
    rows = {row["model"]: row for row in tables["latency_by_model"].records()}
    assert set(rows) == {"big-c", "shadow-m", "small-m"}  # completed attempts only
    # big-c: 1000, 2000, 3000, 4000 ms → p50 2500, p95 3000 + 0.85 × 1000
    assert rows["big-c"] == {
        "model": "big-c",
        "latency_samples": 4,
        "p50_latency_ms": 2500.0,
        "p95_latency_ms": pytest.approx(3850.0),
        "ttft_samples": 1,
        "p50_ttft_ms": 40.0,
        "p95_ttft_ms": 40.0,
    }
    # small-m: 100 (r1), 200 (r4), 300 (r6), 400 (r10)
    assert (rows["small-m"]["p50_latency_ms"], rows["small-m"]["p95_latency_ms"]) == (250.0, pytest.approx(385.0))
    assert (rows["small-m"]["ttft_samples"], rows["small-m"]["p50_ttft_ms"]) == (1, 10.0)
    assert (rows["shadow-m"]["ttft_samples"], rows["shadow-m"]["p50_ttft_ms"]) == (0, None)


def test_summary_totals() -> None:
    summary = build_summary(aggregate(ledger_records()))
    assert (summary["first_day"], summary["last_day"]) == ("2026-11-02", "2026-11-03")
    assert (summary["records"], summary["requests"], summary["attempts"]) == (16, 10, 16)
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (1300, 650)
    assert summary["cost_usd"] == pytest.approx(0.0445)
    assert summary["savings"] == {
        "routed_requests": 7,
        "realised_cost_usd": pytest.approx(0.034),
        "ceiling_cost_usd": pytest.approx(0.074),
        "savings_usd": pytest.approx(0.040),
        "savings_pct": pytest.approx(4000 / 74),
        "completed_without_ceiling": 0,
    }
    assert summary["escalation"] == {
        "auto": {"requests": 3, "escalated_requests": 0, "rate": 0.0, "reasons": {}},
        "cascade": {"requests": 4, "escalated_requests": 2, "rate": 0.5, "reasons": {"low-confidence": 2}},
    }
    assert summary["route_mix"]["cascade:escalated"] == 2
    assert summary["hosting"]["commercial"] == {"tokens": 750, "cost_usd": pytest.approx(0.033), "usd_per_mtok": 44.0}


def test_period_and_team_filters() -> None:
    day1 = aggregate(ledger_records(), since=DAY1)
    assert (day1.num_records, day1.num_skipped, day1.num_requests) == (9, 7, 5)
    day0 = aggregate(ledger_records(), until=DAY0)
    assert (day0.num_records, day0.totals.cost_usd) == (7, pytest.approx(0.027))
    search = aggregate(ledger_records(), team="search")
    assert {team for _, team in search.by_team_day} == {"search"}
    assert (search.num_requests, search.totals.cost_usd) == (5, pytest.approx(0.015))


def test_a_completed_routed_attempt_without_ceiling_counts_at_its_own_cost() -> None:
    records = [rec("a", 1, 1.0, "small-m", "completed", 0.004, requested_model="auto", tier="small")]
    (row,) = build_tables(aggregate(records))["savings_by_day"].rows
    assert row == (DAY0, "auto", 1, 0.004, 0.004, 0.0, 0.0, 1)


def test_attempts_of_a_request_are_joined_across_other_requests() -> None:
    """r2's failed first attempt and its answer on another model, with other requests in between."""
    records = [
        rec("x", 1, 1.0, "large-m", "failed", 0.0, requested_model="auto", tier="large"),
        *[rec(f"y{i}", 1, 1.0 + i / 100, "small-m", "completed", 0.001, requested_model="m") for i in range(1, 30)],
        rec("x", 2, 1.5, "big-c", "completed", 0.01, requested_model="auto", tier="commercial"),
    ]
    mix = {row["route"]: row for row in build_tables(aggregate(records))["route_mix"].records()}
    assert (mix["auto:large"]["requests"], mix["auto:large"]["fallback"]) == (1, 1)
    assert mix["direct"]["requests"] == 29


def test_a_retry_on_the_same_model_is_not_a_fallback() -> None:
    records = [
        rec("x", 1, 1.0, "small-m", "failed", 0.0, requested_model="small-m"),
        rec("x", 2, 1.1, "small-m", "completed", 0.001, requested_model="small-m"),
        rec("z", 1, 2.0, "small-m", "completed", 0.001, requested_model="small-m", route="small-m (fallback)"),
    ]
    (row,) = build_tables(aggregate(records))["route_mix"].records()
    assert (row["requests"], row["as_routed"], row["fallback"]) == (2, 1, 1)


def test_the_request_tracker_keeps_only_recent_requests() -> None:
    finished = []
    tracker = RequestTracker(finished.append, horizon_s=HOUR)
    num_open = []
    for i in range(2000):  # one request every 10 s: about 360 in any hour
        record = rec(f"q{i}", 1, i * 10 / HOUR, "small-m", "completed", 0.0)
        tracker.add(record, DAY0, "(none)")
        num_open.append(tracker.num_open)
    assert max(num_open) <= 362
    tracker.finish()
    assert sorted(t.request_id for t in finished) == sorted(f"q{i}" for i in range(2000))


def test_reservoir_is_exact_below_capacity_and_bounded_above() -> None:
    small = Reservoir(capacity=10)
    for value in (5.0, 1.0, 3.0, 2.0, 4.0):
        small.add(value)
    assert (small.percentile(50), small.percentile(95), small.percentile(0)) == (3.0, pytest.approx(4.8), 1.0)
    assert Reservoir().percentile(50) is None
    big = Reservoir(capacity=200)
    for value in range(100_000):
        big.add(float(value))
    assert big.num_seen == 100_000
    assert len(big._sample) == 200
    assert 35_000 < big.percentile(50) < 65_000  # a uniform sample of 0..99999 (seeded: deterministic)


@pytest.mark.parametrize(
    ("requested_model", "route", "kind"),
    [
        ("auto", None, "auto"),
        ("cascade", "cascade->x", "cascade"),
        ("gpt-4o", "auto:whatever", "direct"),
        (None, "auto:classifier=0.1->small", "auto"),
        (None, "cascade->small-m", "cascade"),
        (None, None, "unrecorded"),
    ],
)
def test_request_kind(requested_model, route, kind) -> None:
    assert request_kind(requested_model, route) == kind


@pytest.mark.parametrize(
    ("route", "tier"),
    [
        ("auto:classifier=0.31<0.45->small", "small"),
        ("auto:classifier=0.62>=0.45->small(large over budget)", "small"),
        ("auto:no-classifier->local-large degraded", "local-large"),
        ("direct", None),
        (None, None),
    ],
)
def test_tier_in_route(route, tier) -> None:
    assert tier_in_route(route) == tier


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("low-confidence (0.31 < 0.5)", "low-confidence"),
        ("low confidence", "low-confidence"),  # rows written before the reasons were spelt as the metrics spell them
        ("Refusal: policy", "refusal"),
        (None, "unspecified"),
    ],
)
def test_escalation_reason(error, reason) -> None:
    assert escalation_reason(error) == reason


async def test_cost_per_key_with_its_prefix() -> None:
    records = [
        rec("k1", 1, 1.0, "small-m", "completed", 0.002, team="search", key_id="key_a"),
        rec("k2", 1, 1.5, "small-m", "failed", 0.0, team="search", key_id="key_a"),
        rec("k2", 2, 1.6, "big-c", "completed", 0.010, team="search", key_id="key_a"),
        rec("k3", 1, 2.0, "small-m", "completed", 0.001, team="support", key_id="key_b"),
        rec("k4", 1, 3.0, "small-m", "completed", 0.004, team=None),
    ]
    report = await build_report(batches_of(records), key_prefixes={"key_a": "sk-sy-aaaaaa…"})
    rows = report.tables["cost_by_key"].records()
    assert [(r["team"], r["key_id"], r["key_prefix"], r["requests"], r["attempts"]) for r in rows] == [
        ("search", "key_a", "sk-sy-aaaaaa…", 2, 3),
        ("(none)", "(no key)", None, 1, 1),
        ("support", "key_b", None, 1, 1),
    ]
    assert rows[0]["cost_usd"] == pytest.approx(0.012)
    assert "sk-sy-aaaaaa…" in report.html()
