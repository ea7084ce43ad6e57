"""One definition of escalation, from the meter's totals (what `/metrics` counts) to the report's
requests; the report's confidence and client latency tables and figures."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from switchyard.billing.metering import RequestMeter, RequestTags
from switchyard.billing.records import UsageRecord
from switchyard.billing.report import build_report
from switchyard.billing.report.confidence import NUM_BINS
from switchyard.billing.report.tables import build_summary, build_tables
from switchyard.core.errors import SwitchyardError
from tests.unit.billing.test_report import DAY0, aggregate, batches_of, rec


@dataclass
class Entry:
    name: str
    backend_kind: str = "openai"
    tier: str | None = None
    hosting: str | None = None


SMALL, LARGE = Entry("small-m", tier="small"), Entry("large-m", tier="large")


class ListLedger:
    def __init__(self) -> None:
        self.records: list[UsageRecord] = []

    def record(self, record: UsageRecord) -> None:
        self.records.append(record)

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _judged_and_dropped(meter: RequestMeter) -> None:
    rung = meter.fork()
    rung.judged(-3.0, -1.0)
    rung.escalated(SMALL, None, 4, "low-confidence")
    meter.fork(escalated_from="small-m").finished(LARGE, "completed", None, 5)


def _failed_then_climbed(meter: RequestMeter) -> None:
    meter.fork().failed(SMALL, SwitchyardError("upstream 502"))
    meter.fork(escalated_from="small-m").finished(LARGE, "completed", None, 5)


def _hedge_answered_first(meter: RequestMeter) -> None:
    meter.fork().finished(SMALL, "cancelled", None, 1)  # the judged rung, dropped for the hedge
    meter.fork(escalated_from="small-m", is_hedge=True).finished(LARGE, "completed", None, 5)


def _accepted_with_a_late_hedge_loser(meter: RequestMeter) -> None:
    rung = meter.fork()
    rung.judged(-0.2, -1.0)
    rung.finished(SMALL, "completed", None, 5)
    meter.fork(escalated_from="small-m", is_hedge=True).finished(LARGE, "cancelled", None, 1)


def _over_budget(meter: RequestMeter) -> None:
    rung = meter.fork()
    rung.judged(-3.0, -1.0)  # unsure, but nothing left to climb on: its answer is sent
    rung.finished(SMALL, "completed", None, 5)


def _nothing_answered(meter: RequestMeter) -> None:
    meter.fork().failed(SMALL, SwitchyardError("timeout"))
    meter.fork(escalated_from="small-m").failed(LARGE, SwitchyardError("timeout"))


def _no_logprobs(meter: RequestMeter) -> None:
    rung = meter.fork()
    rung.judged(None, -1.0)
    rung.escalated(SMALL, None, 4, "no-logprobs")
    meter.fork(escalated_from="small-m").finished(LARGE, "completed", None, 5)


SCENARIOS: dict[str, tuple[Callable[[RequestMeter], None], str, str | None]] = {
    "judged and dropped": (_judged_and_dropped, "escalated", "low-confidence"),
    "failed then climbed": (_failed_then_climbed, "escalated", "error"),
    "hedge answered first": (_hedge_answered_first, "escalated", "hedge"),
    "accepted, hedge lost late": (_accepted_with_a_late_hedge_loser, "accepted", None),
    "over budget": (_over_budget, "accepted", None),
    "nothing answered": (_nothing_answered, "failed", None),
    "no logprobs": (_no_logprobs, "escalated", "no-logprobs"),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("entry", ["auto", "cascade"])
def test_the_meter_and_the_report_agree_on_how_a_routed_request_ended(scenario: str, entry: str) -> None:
    attempts, outcome, reason = SCENARIOS[scenario]
    ledger = ListLedger()
    meter = RequestMeter(ledger, {}, "req_1")
    meter.tags = RequestTags(requested_model=entry, route=f"{entry}:classifier=0.2<0.45->small")
    attempts(meter)
    assert meter.totals.escalation == outcome  # what /metrics counts
    summary = build_summary(aggregate(ledger.records))  # what the report counts
    escalation = summary["escalation"][entry]
    assert (escalation["requests"], escalation["escalated_requests"]) == (1, outcome == "escalated")
    assert escalation["reasons"] == ({reason: 1} if reason else {})
    [label] = summary["route_mix"]
    if entry == "cascade":
        assert label == f"cascade:{outcome}"
    else:
        assert label == ("auto:small→large" if outcome == "escalated" else "auto:small")


def test_judged_records_keep_their_confidence_and_threshold() -> None:
    ledger = ListLedger()
    _judged_and_dropped(RequestMeter(ledger, {}, "req_1"))
    _no_logprobs(RequestMeter(ledger, {}, "req_2"))
    dropped, answered, unscored, _ = ledger.records
    assert (dropped.confidence, dropped.threshold) == (-3.0, -1.0)
    assert (answered.confidence, answered.threshold) == (None, None)  # the last rung: never judged
    assert (unscored.confidence, unscored.threshold, unscored.error) == (None, -1.0, "no-logprobs")


def _judged(request_id: str, at_h: float, model: str, confidence: float | None, threshold: float) -> UsageRecord:
    status = "escalated" if confidence is None or confidence < threshold else "completed"
    return rec(request_id, 1, at_h, model, status, 0.0, requested_model="cascade", confidence=confidence,
               threshold=threshold)  # fmt: skip


def test_confidence_is_binned_per_model_with_its_threshold_inside_the_range() -> None:
    records = [_judged(f"s{i}", 1.0 + i / 100, "small-m", -0.1 * i, -0.8) for i in range(1, 21)]  # -0.1 … -2.0
    records += [_judged("n", 1.5, "small-m", None, -0.8)]  # no logprobs
    records += [_judged("t", 1.6, "tiny-m", 0.9, 0.5), _judged("t2", 1.7, "tiny-m", 0.7, 0.5)]
    tables = build_tables(aggregate(sorted(records, key=lambda r: r.started_at)))
    rows = {row["model"]: row for row in tables["confidence_by_model"].records()}
    assert rows["small-m"] == {
        "model": "small-m",
        "threshold": -0.8,
        "judged": 21,
        "below_threshold": 12,  # -0.9 … -2.0
        "without_confidence": 1,
        "min_confidence": pytest.approx(-2.0),
        "max_confidence": pytest.approx(-0.1),
    }
    assert (rows["tiny-m"]["judged"], rows["tiny-m"]["below_threshold"]) == (2, 0)
    bins = [row for row in tables["confidence_histogram"].records() if row["model"] == "small-m"]
    assert len(bins) == NUM_BINS and sum(row["answers"] for row in bins) == 20
    assert bins[0]["bin_low"] == pytest.approx(-2.0) and bins[-1]["bin_high"] == pytest.approx(-0.1)
    tiny = [row for row in tables["confidence_histogram"].records() if row["model"] == "tiny-m"]
    assert tiny[0]["bin_low"] == pytest.approx(0.5)  # the threshold, below every score, is on the axis
    assert sum(row["answers"] for row in tiny) == 2


def _answered(request_id: str, at_h: float, route: str, ttfb_ms: float, duration_ms: float, attempt_ms: float):
    entry, _, outcome = route.partition(":")
    records = []
    if outcome == "escalated":
        records.append(rec(request_id, 1, at_h, "small-m", "escalated", 0.0, requested_model=entry))
    records.append(
        rec(request_id, len(records) + 1, at_h + 0.001, "large-m" if records else "small-m", "completed", 0.0,
            requested_model=entry if entry != "direct" else "small-m", escalated_from="small-m" if records else None,
            duration_ms=attempt_ms, request_ttfb_ms=ttfb_ms, request_duration_ms=duration_ms)
    )  # fmt: skip
    return records


def test_latency_as_the_client_saw_it_per_route() -> None:
    records = [
        *_answered("d1", 1.00, "direct", 10.0, 100.0, 95.0),
        *_answered("d2", 1.01, "direct", 30.0, 300.0, 290.0),
        *_answered("a1", 1.02, "cascade:accepted", 200.0, 400.0, 380.0),
        *_answered("e1", 1.03, "cascade:escalated", 900.0, 1500.0, 600.0),
        rec("old", 1, 1.04, "small-m", "completed", 0.0, requested_model="small-m"),  # no client times: not counted
    ]
    agg = aggregate(records)
    rows = {row["route"]: row for row in build_tables(agg)["latency_by_route"].records()}
    assert list(rows) == ["cascade:accepted", "cascade:escalated", "direct"]
    assert rows["direct"] == {
        "route": "direct",
        "requests": 2,
        "p50_ttfb_ms": 20.0,
        "p95_ttfb_ms": pytest.approx(29.0),
        "p50_duration_ms": 200.0,
        "p95_duration_ms": pytest.approx(290.0),
        "p50_added_ms": 7.5,  # 5 and 10: what the request took beyond its answering attempt
        "p95_added_ms": pytest.approx(9.75),
    }
    assert (rows["cascade:escalated"]["p50_ttfb_ms"], rows["cascade:escalated"]["p50_added_ms"]) == (900.0, 900.0)
    assert build_summary(agg)["latency_by_route"]["cascade:accepted"]["p50_duration_ms"] == 400.0


def test_the_confidence_and_client_latency_figures_are_drawn() -> None:
    records = [_judged(f"s{i}", 1.0 + i / 100, "small-m", -0.2 * i, -0.8) for i in range(1, 8)]
    records += _answered("d1", 2.0, "direct", 10.0, 100.0, 95.0)
    report = asyncio.run(build_report(batches_of(sorted(records, key=lambda r: r.started_at))))
    assert {"fig-confidence", "fig-latency-route"} <= set(report.figure_ids)
    page = report.html()
    for figure_id in ("fig-confidence", "fig-latency-route"):
        figure = re.search(rf'<figure id="{figure_id}"[^>]*>(.*?)</figure>', page, re.S)
        assert figure and f'id="{figure_id}-mark-1"' in figure.group(1)
    assert "threshold -0.8" in page
    assert report.summary["escalation"]["cascade"]["requests"] == 7
    assert report.tables["escalation_by_day"].rows[0][:2] == (DAY0, "cascade")
