"""Refused requests through a real proxy: one ledger record each, counted by reason in the metrics,
the reports and the usage API, and never as a request, a cost or a latency; and a spent budget's
Retry-After, which the `openai` SDK takes as a reason to stop, not to try again."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from switchyard.billing.budgets import RETRY_AFTER_CAP_S, start_of_utc_day
from switchyard.billing.report import build_report
from switchyard.billing.store import open_database
from switchyard.billing.teams import digest, key_id_for
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.clock import ManualClock
from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

PRICE = {"input_usd_per_mtok": 0, "output_usd_per_mtok": 200.0}  # the fake's 5 answer tokens: $0.001
TEAMS = {
    "research": {"api_keys": ["sk-research"], "models": ["priced"]},
    "limited": {"api_keys": ["sk-limited"], "rpm": 1},
    "broke": {"api_keys": ["sk-broke"], "budget_usd_per_day": 0.0015},  # one answer, then spent
}
HI = [{"role": "user", "content": "hi"}]


@contextmanager
def proxy(tmp_path: Path) -> Iterator[tuple[str, object]]:
    with serve_in_thread(FakeOpenAIUpstream(FakeState())) as upstream:
        settings = Settings(
            models=[
                {"name": "priced", "base_url": upstream + "/v1", "price": PRICE, "capabilities": {"tools": False}},
                {"name": "other", "base_url": upstream + "/v1", "price": PRICE},
            ],
            teams=TEAMS,
            auth={"admin_key": "sk-admin"},
            billing={"database_url": f"sqlite:///{tmp_path / 'usage.db'}", "spill_path": tmp_path / "spill.jsonl"},
        )
        app = create_app(settings)
        with serve_in_thread(app) as url:
            yield url, app


def _post(url: str, body: dict | bytes, key: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    if isinstance(body, bytes):
        return httpx.post(url + "/v1/chat/completions", content=body, headers=headers, timeout=30)
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _metrics(url: str) -> dict:
    families = text_string_to_metric_families(
        httpx.get(url + "/metrics", headers={"authorization": "Bearer sk-admin"}, timeout=30).text
    )
    return {f.name: f for f in families}


def _value(families: dict, sample: str, **labels: str) -> float:
    family = families[sample.removesuffix("_total").removesuffix("_count")]
    return sum(s.value for s in family.samples if s.name == sample and s.labels | labels == s.labels)


def test_each_refusal_is_one_ledger_record_by_reason_and_no_request_cost_or_latency(tmp_path):
    with proxy(tmp_path) as (url, app):
        answered = [_post(url, {"model": "priced", "messages": HI}, "sk-research")]
        answered.append(_post(url, {"model": "priced", "messages": HI}, "sk-limited"))
        refused = {
            "invalid_json": _post(url, b"{not json", "sk-research"),
            "missing_required_parameter": _post(url, {"model": "priced"}, "sk-research"),
            "unsupported_parameter": _post(
                url,
                {"model": "priced", "messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]},
                "sk-research",
            ),
            "model_not_found": _post(url, {"model": "no-such-model", "messages": HI}, "sk-research"),
            "model_not_allowed": _post(url, {"model": "other", "messages": HI}, "sk-research"),
            "rate_limit": _post(url, {"model": "priced", "messages": HI}, "sk-limited"),
        }
        no_key = _post(url, {"model": "priced", "messages": HI}, None)
        assert [r.status_code for r in answered] == [200, 200]
        assert {reason: r.status_code for reason, r in refused.items()} == {
            "invalid_json": 400,
            "missing_required_parameter": 400,
            "unsupported_parameter": 400,
            "model_not_found": 404,
            "model_not_allowed": 403,
            "rate_limit": 429,
        }
        assert no_key.status_code == 401
        assert wait_until(lambda: len(read_ledger(app)) == 2 + len(refused), timeout_s=30), read_ledger(app)
        ledger = read_ledger(app)
        families = _metrics(url)
        usage = httpx.get(url + "/v1/usage", headers={"authorization": "Bearer sk-research"}).json()
        by_model = httpx.get(
            url + "/admin/usage", headers={"authorization": "Bearer sk-admin"}, params={"group_by": "model"}
        )

    for reason, response in refused.items():
        [record] = [r for r in ledger if r.request_id == response.headers["x-request-id"]]
        team = "limited" if reason == "rate_limit" else "research"
        assert (record.status, record.attempt, record.error, record.team) == ("refused", 0, reason, team)
        assert record.key_id == key_id_for(digest(f"sk-{team}"))
        assert (record.model, record.cost_usd, record.prompt_tokens, record.completion_tokens) == ("", 0.0, 0, 0)
    assert [r for r in ledger if r.request_id == no_key.headers["x-request-id"]] == []  # no team: metrics only
    assert read_ledger(app, request_id=refused["model_not_found"].headers["x-request-id"])[0].requested_model == (
        "no-such-model"
    )

    refusals = {
        (s.labels["team"], s.labels["reason"]): s.value
        for s in families["switchyard_refusals"].samples
        if s.name == "switchyard_refusals_total"
    }
    assert refusals == {("research", r): 1.0 for r in refused if r != "rate_limit"} | {
        ("limited", "rate_limit"): 1.0,
        ("", "invalid_api_key"): 1.0,
    }
    assert _value(families, "switchyard_requests_total") == 2 + len(refused) + 1  # every request, once
    assert _value(families, "switchyard_request_duration_seconds_count") == 2  # the answered ones only
    # the answered ones only: whole answers assembled from the upstream's stream, each with a first token
    assert _value(families, "switchyard_time_to_first_token_seconds_count") == 2

    assert usage["requests"] == 1 and usage["cost_usd"] == pytest.approx(0.001)  # research's answer only
    assert [row["model"] for row in by_model.json()["data"]] == ["priced"]
    assert by_model.json()["requests"] == 2


def test_the_report_counts_refusals_apart_from_every_other_figure(tmp_path):
    with proxy(tmp_path) as (url, app):
        assert _post(url, {"model": "priced", "messages": HI}, "sk-research").status_code == 200
        assert _post(url, {"model": "other", "messages": HI}, "sk-research").status_code == 403
        assert _post(url, {"model": "other", "messages": HI}, "sk-research").status_code == 403
        assert _post(url, b"[", "sk-research").status_code == 400
        assert wait_until(lambda: len(read_ledger(app)) == 4, timeout_s=30)
        page = httpx.get(url + "/v1/usage/report", headers={"authorization": "Bearer sk-research"}, timeout=60)

    async def report():
        database = await open_database(f"sqlite:///{tmp_path / 'usage.db'}")
        try:
            return await build_report(database.iter_usage(None, None, "research"), team="research")
        finally:
            await database.aclose()

    written = asyncio.run(report()).write(tmp_path / "report")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    with (tmp_path / "report" / "refusals.csv").open() as file:
        rows = list(csv.DictReader(file))
    with (tmp_path / "report" / "latency_by_model.csv").open() as file:
        latency = list(csv.DictReader(file))

    assert tmp_path / "report" / "refusals.csv" in written
    assert (summary["requests"], summary["attempts"], summary["records"]) == (1, 1, 1)
    assert summary["refusals"] == {
        "total": 3,
        "by_reason": {"invalid_json": 1, "model_not_allowed": 2},
        "by_team": {"research": {"invalid_json": 1, "model_not_allowed": 2}},
    }
    key_id = key_id_for(digest("sk-research"))
    assert [(r["team"], r["key_id"], r["reason"], r["refusals"]) for r in rows] == [
        ("research", key_id, "model_not_allowed", "2"),
        ("research", key_id, "invalid_json", "1"),
    ]
    assert [(r["model"], r["latency_samples"]) for r in latency] == [("priced", "1")]
    assert page.status_code == 200 and '<section class="panel" id="refusals">' in page.text


def _clock_at(at: float) -> ManualClock:
    clock = ManualClock()
    clock.now = at
    return clock


def test_a_spent_budget_is_retried_at_its_renewal_and_the_sdk_stops_after_one_request(tmp_path):
    midnight = start_of_utc_day(time.time()) + 86_400
    renews = dt.datetime.fromtimestamp(midnight, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with proxy(tmp_path) as (url, app), openai.OpenAI(base_url=url + "/v1", api_key="sk-broke") as sdk:
        assert sdk.max_retries == 2  # the SDK's default: it retries a 429 it may retry
        budgets = app.state.services.budgets
        sdk.chat.completions.create(model="priced", messages=HI, max_tokens=5)  # $0.001 of $0.0015
        budgets.clock = _clock_at(midnight - 5 * 3600)
        with pytest.raises(openai.RateLimitError) as spent:
            sdk.chat.completions.create(
                model="priced", messages=HI, max_tokens=5, extra_headers={"x-request-id": "sdk-call"}
            )
        budgets.clock = _clock_at(midnight - 30)
        soon = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "priced", "messages": HI, "max_tokens": 5},
            headers={"authorization": "Bearer sk-broke", "x-request-id": "near-midnight"},
        )
        assert wait_until(lambda: read_ledger(app, client_request_id="near-midnight"), timeout_s=30)
        sdk_rows = read_ledger(app, client_request_id="sdk-call")

    headers = spent.value.response.headers
    assert len(sdk_rows) == 1 and sdk_rows[0].status == "refused"  # the SDK did not try again
    assert headers["retry-after"] == str(RETRY_AFTER_CAP_S) and headers["x-should-retry"] == "false"
    message = spent.value.body["message"]
    assert "Team 'broke' has $0.000500 left of its budget for today ($0.0015)" in message
    assert f"it renews at {renews}" in message
    assert soon.status_code == 429 and soon.headers["retry-after"] == "30"  # the time left until midnight
    assert "x-should-retry" not in soon.headers  # a wait the SDK would make, for a budget renewed by then


def test_a_request_no_budget_can_hold_says_so_and_is_not_retried(tmp_path):
    with proxy(tmp_path) as (url, app), openai.OpenAI(base_url=url + "/v1", api_key="sk-broke") as sdk:
        with pytest.raises(openai.RateLimitError) as never:  # 100 answer tokens: $0.02, over the whole $0.0015
            sdk.chat.completions.create(
                model="priced", messages=HI, max_tokens=100, extra_headers={"x-request-id": "too-big"}
            )
        assert wait_until(lambda: read_ledger(app, client_request_id="too-big"), timeout_s=30)
        httpx.post(url + "/v1/chat/completions", content=b"{", headers={"authorization": "Bearer sk-broke"})
        assert wait_until(lambda: len(read_ledger(app)) == 2, timeout_s=30)  # nothing more from the SDK
    assert "it can never fit" in never.value.body["message"]
    assert "retry-after" not in never.value.response.headers
    assert never.value.response.headers["x-should-retry"] == "false"
