"""One definition of escalation, and the client's own times, from the proxy to the report.

A proxy with `auto` (two tiers) and a cascade (small → large) in front of two fake upstreams is
sent a known mix, whole answers and streams alike: models named directly, auto routed small and
accepted, auto routed small and climbed to large, auto routed large, the cascade accepted and
escalated. Then the same numbers are read back from `/metrics`, from the ledger and from the report
built on it (summary.json and its CSV files): per entry point, the requests a rung other than
their first answered over all the requests of that entry point.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import json
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchyard.billing.records import UsageRecord
from switchyard.billing.report import SUMMARY_FILE, build_report
from switchyard.billing.store import open_database
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_for_records, wait_until
from tests.servers.postgres import postgres_server, postgres_url  # noqa: F401

PRICE = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
SURE, UNSURE = -0.1, -3.0  # the small model's logprob per token: over and under the threshold
THRESHOLD = -1.0


def _settings(ledger: dict, small: str, large: str) -> Settings:
    return Settings(
        models=[
            {"name": "m-small", "base_url": small, "tier": "small", "price": PRICE},
            {"name": "m-large", "base_url": large, "tier": "large", "price": PRICE},
        ],
        routing={
            "auto": {
                "tiers": ["small", "large"],
                "thresholds": [0.45],
                "warm_up": False,
                "deadline_ms": 10_000,
                "max_wait_ms": 1,
            }
        },
        cascade={"ladder": ["m-small", "m-large"], "scorer": "mean_logprob", "threshold": THRESHOLD},
        resilience={"max_attempts": 1},
        upstream={"health_timeout_s": 30},  # a probe late on a busy machine must not take a tier out of the routes
        billing=ledger,
    )


def _proxy(stack: ExitStack, ledger: dict):
    states = {
        "small": FakeState(behaviour=FakeBehaviour(words=("small",))),
        "large": FakeState(behaviour=FakeBehaviour(words=("large",))),
    }
    urls = {name: stack.enter_context(serve_in_thread(FakeOpenAIUpstream(s))) + "/v1" for name, s in states.items()}
    # the classifier's score is read out of the prompt, so the route is known in advance
    app = create_app(
        _settings(ledger, urls["small"], urls["large"]),
        score_batch=lambda texts: np.array([float(t.rsplit("=", 1)[-1]) for t in texts]),
    )
    return stack.enter_context(serve_in_thread(app)), app


def _send(base: str, model: str, *, score: float = 0.5, logprob: float = SURE, stream: bool = False) -> str:
    """One request, its body read to the end; returns its request id."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"score={score}"}],
        "stream": stream,
        "fake": {"logprobs": [logprob]},  # what the small model is this sure of
    }
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as response:
        response.read()
    assert response.status_code == 200, response.text
    return response.headers["x-request-id"]


# (model, classifier score, small model's logprob) -> (entry point, outcome, route in the report)
MIX = {
    ("m-large", 0.5, SURE): ("explicit", "accepted", "direct"),
    ("auto", 0.2, SURE): ("auto", "accepted", "auto:small"),
    ("auto", 0.2, UNSURE): ("auto", "escalated", "auto:small→large"),
    ("auto", 0.9, UNSURE): ("auto", "accepted", "auto:large"),  # the last rung: never judged
    ("cascade", 0.5, SURE): ("cascade", "accepted", "cascade:accepted"),
    ("cascade", 0.5, UNSURE): ("cascade", "escalated", "cascade:escalated"),
}


def _send_the_mix(base: str) -> dict[str, tuple[str, str, str, bool]]:
    """Each request of MIX once whole and once streamed: request id -> (entry, outcome, route, stream)."""
    sent = {}
    for stream in (False, True):
        for (model, score, logprob), expected in MIX.items():
            sent[_send(base, model, score=score, logprob=logprob, stream=stream)] = (*expected, stream)
    return sent


def _metrics(base: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(base + "/metrics", timeout=30).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sum(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= have)


def _report(url: str, out: Path) -> dict:
    async def build() -> None:
        database = await open_database(url)
        try:
            report = await build_report(database.iter_usage(None, None, None))
        finally:
            await database.aclose()
        report.write(out)

    asyncio.run(build())
    return json.loads((out / SUMMARY_FILE).read_text())


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _by_request(records: list[UsageRecord]) -> dict[str, list[UsageRecord]]:
    by_request: dict[str, list[UsageRecord]] = {}
    for record in records:
        by_request.setdefault(record.request_id, []).append(record)
    return {request_id: sorted(rows, key=lambda r: r.attempt) for request_id, rows in by_request.items()}


def _check_judged_and_client_times(sent: dict, records: list[UsageRecord]) -> None:
    """Judged rungs keep their confidence and threshold; the answer sent carries the client's times."""
    by_request = _by_request(records)
    assert set(by_request) == set(sent)
    for request_id, (_, outcome, route, stream) in sent.items():
        rows = by_request[request_id]
        answer = rows[-1]
        assert answer.status == "completed"
        for row in rows[:-1]:
            assert row.status == "escalated" and row.request_ttfb_ms is None and row.request_duration_ms is None
        if route in ("auto:small", "cascade:accepted"):
            [judged] = rows
            assert (judged.model, judged.threshold) == ("m-small", THRESHOLD)
            assert judged.confidence == pytest.approx(SURE)
        elif outcome == "escalated":
            judged, answer = rows
            assert (judged.model, judged.confidence, judged.threshold) == ("m-small", pytest.approx(UNSURE), THRESHOLD)
            assert answer.escalated_from == "m-small"
        if answer.model == "m-large":  # the last rung, or named directly: never judged
            assert answer.confidence is None and answer.threshold is None
        # as the client saw it: from the request's arrival, so never less than the attempt's own time
        assert answer.request_ttfb_ms is not None and answer.request_duration_ms is not None
        assert answer.request_ttfb_ms <= answer.request_duration_ms
        assert answer.request_duration_ms >= answer.duration_ms
        if stream:  # the first chunk the client got came after the answering attempt's first chunk
            assert answer.ttft_ms is not None and answer.request_ttfb_ms >= answer.ttft_ms
        else:
            assert answer.request_ttfb_ms == answer.request_duration_ms  # a whole answer: one write
        if outcome == "escalated":  # the client waited for the dropped rung too
            assert answer.request_duration_ms >= rows[0].duration_ms + answer.duration_ms


def test_one_escalation_rate_per_entry_point_in_metrics_ledger_and_report(tmp_path: Path, monkeypatch) -> None:
    # this test's own ledger: the environment's (the suite's shared one) wins over the settings' keys
    monkeypatch.setenv("SWITCHYARD__BILLING__LEDGER_PATH", str(tmp_path / "usage.db"))
    with ExitStack() as stack:
        base, app = _proxy(stack, {"ledger_path": tmp_path / "usage.db"})
        sent = _send_the_mix(base)
        # refused before any model was called: counted as requests, never in the escalation rate or latency
        unknown = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(base + "/v1/chat/completions", json=unknown, timeout=30).status_code == 404
        assert httpx.post(base + "/v1/chat/completions", json={"model": "cascade"}, timeout=30).status_code == 400
        routed = "switchyard_routed_requests_total"
        assert wait_until(lambda: _sum(_metrics(base), "switchyard_requests_total") == 14, timeout_s=30)
        samples = _metrics(base)
        assert _sum(samples, routed) == 10
        assert _sum(samples, "switchyard_request_ttfb_seconds_count") == 12
        assert _sum(samples, "switchyard_request_ttlb_seconds_count") == 12
        records = wait_for_records(app, 16)  # 12 requests, 4 of them escalated: 2 attempts each
        today = dt.datetime.now(dt.UTC).date().isoformat()
        period = {"start_date": today, "end_date": today}
        by_route = httpx.get(base + "/v1/usage", params=period | {"group_by": "route"}, timeout=30).json()
        in_total = httpx.get(base + "/v1/usage", params=period, timeout=30).json()
    assert len(records) == 16

    expected = {entry: Counter() for entry in ("auto", "cascade")}
    for entry, outcome, _, _ in sent.values():
        if entry != "explicit":
            expected[entry][outcome] += 1
    assert expected == {"auto": Counter(accepted=4, escalated=2), "cascade": Counter(accepted=2, escalated=2)}

    summary = _report(app.state.services.settings.billing.resolved_database_url(), tmp_path / "report")
    by_day = _csv(tmp_path / "report" / "escalation_by_day.csv")
    for entry, outcomes in expected.items():
        num_requests, num_escalated = sum(outcomes.values()), outcomes["escalated"]
        # /metrics: the counter's ratio is the rate the alert watches
        assert _sum(samples, routed, entry=entry) == num_requests
        assert _sum(samples, routed, entry=entry, outcome="escalated") == num_escalated
        metric_rate = _sum(samples, routed, entry=entry, outcome="escalated") / _sum(samples, routed, entry=entry)
        # summary.json
        escalation = summary["escalation"][entry]
        assert (escalation["requests"], escalation["escalated_requests"]) == (num_requests, num_escalated)
        # the CSV file (one row per day and entry point)
        rows = [row for row in by_day if row["entry"] == entry]
        assert sum(int(row["requests"]) for row in rows) == num_requests
        assert sum(int(row["escalated_requests"]) for row in rows) == num_escalated
        csv_rate = num_escalated / num_requests
        assert escalation["rate"] == pytest.approx(metric_rate) == pytest.approx(csv_rate)
        assert len(rows) == 1 and float(rows[0]["escalation_rate"]) == pytest.approx(metric_rate)
    assert summary["escalation"]["cascade"]["reasons"] == {"low-confidence": 2}

    # the route mix says how each route ended
    assert summary["route_mix"] == {
        "auto:large": 2,
        "auto:small": 2,
        "auto:small→large": 2,
        "cascade:accepted": 2,
        "cascade:escalated": 2,
        "direct": 2,
    }
    mix = {row["route"]: row for row in _csv(tmp_path / "report" / "route_mix.csv")}
    assert int(mix["auto:small→large"]["as_routed"]) == 2
    # /v1/usage names and counts the routes as the report does, and adds up to the same cost
    assert {row["route"]: row["requests"] for row in by_route["data"]} == summary["route_mix"]
    assert in_total["requests"] == 12 and in_total["cost_usd"] == pytest.approx(summary["cost_usd"], abs=1e-8)

    _check_judged_and_client_times(sent, records)

    # client-seen times: by route in /metrics (entry point and outcome, never a model) and in the report
    for route, count in {
        "explicit": 2, "auto:accepted": 4, "auto:escalated": 2, "cascade:accepted": 2, "cascade:escalated": 2,
    }.items():  # fmt: skip
        assert _sum(samples, "switchyard_request_ttfb_seconds_count", route=route) == count, route
        assert _sum(samples, "switchyard_request_ttlb_seconds_count", route=route) == count, route
    latency = {row["route"]: row for row in _csv(tmp_path / "report" / "latency_by_route.csv")}
    assert {route: int(row["requests"]) for route, row in latency.items()} == summary["route_mix"]
    for row in latency.values():
        assert float(row["p50_ttfb_ms"]) <= float(row["p95_duration_ms"])
    assert summary["latency_by_route"]["cascade:escalated"]["requests"] == 2

    # the judged answers' confidence against the threshold, per judged model
    [judged] = _csv(tmp_path / "report" / "confidence_by_model.csv")
    assert (judged["model"], float(judged["threshold"]), judged["judged"], judged["below_threshold"]) == (
        "m-small",
        THRESHOLD,
        "8",  # auto small accepted and climbed, cascade accepted and escalated: whole and streamed
        "4",
    )
    bins = _csv(tmp_path / "report" / "confidence_histogram.csv")
    assert {row["model"] for row in bins} == {"m-small"} and sum(int(row["answers"]) for row in bins) == 8
    page = (tmp_path / "report" / "report.html").read_text()
    assert 'id="fig-confidence"' in page and 'id="fig-latency-route"' in page


def test_the_judged_rungs_and_client_times_land_in_postgresql(postgres_url: str) -> None:  # noqa: F811
    with ExitStack() as stack:
        base, _ = _proxy(stack, {"database_url": postgres_url})
        sent = {
            _send(base, "cascade", logprob=SURE, stream=True): ("cascade", "accepted", "cascade:accepted", True),
            _send(base, "cascade", logprob=UNSURE): ("cascade", "escalated", "cascade:escalated", False),
            _send(base, "auto", score=0.2, logprob=UNSURE, stream=True): (
                "auto",
                "escalated",
                "auto:small→large",
                True,
            ),  # fmt: skip
        }
        assert wait_until(lambda: len(read_ledger(postgres_url)) == 5, timeout_s=30), read_ledger(postgres_url)
    _check_judged_and_client_times(sent, read_ledger(postgres_url))
